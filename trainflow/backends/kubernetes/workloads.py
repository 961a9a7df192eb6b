"""The object that runs an attempt's pods, in the launch API the spec names.

- indexed-job: a batch/v1 Job, completionMode Indexed, one pod per node; pod 0 hosts the c10d
  store at `<job>-0.<service>` (the headless Service gives each pod a DNS name).
- jobset: a JobSet with one replicated Job of the same shape; JobSet's DNS hostnames
  (`<jobset>-node-0-<index>.<service>`) use the run's headless Service as subdomain.
- pytorchjob: a Kubeflow PyTorchJob with one Master (node 0) and nodes-1 Workers; the operator's
  per-replica Service `<job>-master-0` is the rendezvous address.

In every case retries belong to the flow: backoffLimit 0, no JobSet restarts, a podFailurePolicy
that fails the Job at the first failed pod, and Kueue's queue label when the spec names a queue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainflow.backends.kubernetes.classify import REPLICA_INDEX, pod_failure_policy
from trainflow.backends.kubernetes.config import LaunchApi, kubernetes_config
from trainflow.backends.kubernetes.names import KUEUE_QUEUE_LABEL, WORKERS, RunNames
from trainflow.backends.kubernetes.pod import (
    CONTAINER,
    NodeIdentity,
    agent_command,
    completion_index_identity,
    pod_template,
)
from trainflow.runspec import RunSpec

JOBSET_API = ("jobset.x-k8s.io/v1alpha2", "JobSet")
PYTORCHJOB_API = ("kubeflow.org/v1", "PyTorchJob")
JOB_API = ("batch/v1", "Job")
JOBSET_REPLICA = "node"
PYTORCH_CONTAINER = "pytorch"  # the training operator looks for a container of this name


@dataclass(frozen=True)
class Attempt:
    """Everything that decides an attempt's manifests."""

    spec: RunSpec
    run_id: str
    attempt: int
    image: str

    @property
    def names(self) -> RunNames:
        return RunNames(self.run_id)

    @property
    def name(self) -> str:
        return self.names.workload(self.attempt)

    @property
    def rendezvous_id(self) -> str:
        return f"{self.names.base}-{self.attempt}"


def _metadata(attempt: Attempt) -> dict:
    labels = attempt.names.labels(WORKERS, attempt.attempt)
    if kubernetes_config(attempt.spec).kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = kubernetes_config(attempt.spec).kueue_queue
    return {
        "name": attempt.name,
        "namespace": kubernetes_config(attempt.spec).namespace,
        "labels": labels,
        "annotations": attempt.names.annotations(),
    }


def _indexed_job_spec(attempt: Attempt, rendezvous_host: str, subdomain: str | None) -> dict:
    nodes = attempt.spec.resources.nodes
    command = agent_command(attempt.spec, rendezvous_host, attempt.rendezvous_id)
    template = pod_template(
        attempt.spec,
        attempt.run_id,
        attempt.attempt,
        attempt.image,
        command,
        completion_index_identity(),
        subdomain=subdomain,
    )
    return {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(CONTAINER),
        "template": template,
    }


def indexed_job(attempt: Attempt) -> dict:
    service = attempt.names.service
    job = {
        "apiVersion": JOB_API[0],
        "kind": JOB_API[1],
        "metadata": _metadata(attempt),
        "spec": _indexed_job_spec(attempt, f"{attempt.name}-0.{service}", subdomain=service),
    }
    if kubernetes_config(attempt.spec).kueue_queue:
        job["spec"]["suspend"] = True  # Kueue unsuspends it once the whole job is admitted
    return job


def jobset(attempt: Attempt) -> dict:
    service = attempt.names.service
    first_pod = f"{attempt.name}-{JOBSET_REPLICA}-0-0.{service}"
    spec: dict = {
        "failurePolicy": {"maxRestarts": 0},
        "network": {"enableDNSHostnames": True, "subdomain": service, "publishNotReadyAddresses": True},
        "replicatedJobs": [
            {
                "name": JOBSET_REPLICA,
                "replicas": 1,
                "template": {
                    "metadata": {"labels": attempt.names.labels(WORKERS, attempt.attempt)},
                    "spec": _indexed_job_spec(attempt, first_pod, subdomain=None),
                },
            }
        ],
    }
    if kubernetes_config(attempt.spec).kueue_queue:
        spec["suspend"] = True
    return {"apiVersion": JOBSET_API[0], "kind": JOBSET_API[1], "metadata": _metadata(attempt), "spec": spec}


def pytorchjob(attempt: Attempt) -> dict:
    nodes = attempt.spec.resources.nodes
    command = agent_command(attempt.spec, f"{attempt.name}-master-0", attempt.rendezvous_id)

    def template(identity: NodeIdentity) -> dict:
        return pod_template(
            attempt.spec,
            attempt.run_id,
            attempt.attempt,
            attempt.image,
            command,
            identity,
            container=PYTORCH_CONTAINER,
            port_name="pytorchjob-port",
        )

    replica_index = {
        "name": "TRAINFLOW_REPLICA",
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{REPLICA_INDEX}']"}},
    }
    master = template(NodeIdentity((), "master-0.json"))
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": master}}
    if nodes > 1:
        replicas["Worker"] = {
            "replicas": nodes - 1,
            "restartPolicy": "Never",
            "template": template(NodeIdentity((replica_index,), "worker-$(TRAINFLOW_REPLICA).json")),
        }
    run_policy: dict = {
        "backoffLimit": 0,
        "cleanPodPolicy": "None",
    }  # pods stay until teardown: their status is evidence
    if kubernetes_config(attempt.spec).kueue_queue:
        run_policy["suspend"] = True
    return {
        "apiVersion": PYTORCHJOB_API[0],
        "kind": PYTORCHJOB_API[1],
        "metadata": _metadata(attempt),
        "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas},
    }


WORKLOADS: dict[LaunchApi, tuple[tuple[str, str], Callable[[Attempt], dict]]] = {
    LaunchApi.indexed_job: (JOB_API, indexed_job),
    LaunchApi.jobset: (JOBSET_API, jobset),
    LaunchApi.pytorchjob: (PYTORCHJOB_API, pytorchjob),
}


def workload(attempt: Attempt) -> dict:
    return WORKLOADS[kubernetes_config(attempt.spec).launch_api][1](attempt)


def workload_api(api: LaunchApi) -> tuple[str, str]:
    """(apiVersion, kind) of the object a launch API creates."""
    return WORKLOADS[api][0]
