"""Kubernetes backend: the same lifecycle on a cluster (`resources.backend: kubernetes`).

Each attempt is one workload (Indexed Job, JobSet or Kubeflow PyTorchJob) whose pods run torchrun
with c10d rendezvous at node 0's DNS name (a headless Service per run); worker configs come from
a Secret per attempt (they hold the status token; secret_env values too); pods report to the
orchestrator's status channel like local workers. Pod status (OOMKilled, evicted, preempted, node
lost, image pull errors) is classified in `classify`; all API calls go through `cluster.Cluster`.
"""
