"""The pod every node of an attempt runs: trainflow's node agent (torchrun with c10d rendezvous,
the node's status relay, a plain script's own checkpoints: trainflow/backends/agent.py), the worker
config, the node-local checkpoint tier, and the resources, placement and grace the spec asks for.

A pod learns which node it is from the cluster (the Job completion index, or the PyTorchJob
replica index) through the downward API, and reads its own key of the attempt's worker-config
Secret (the configs hold the status token); nothing in the template differs between nodes, so one
template serves them all. The variables of `workload.secret_env` come from the same Secret.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainflow.backends.kubernetes.config import LaunchApi, kubernetes_config
from trainflow.backends.kubernetes.names import LABEL_ATTEMPT, LABEL_RUN, WORKERS, RunNames
from trainflow.backends.rank_records import RECORDS_ENV
from trainflow.runspec import RunSpec
from trainflow.worker_config import CONFIG_ENV, JOB_ENV

CONTAINER = "trainer"
RENDEZVOUS_PORT = 29400
CONFIG_DIR = "/etc/trainflow"
SCRATCH_DIR = "/scratch"  # the pod's emptyDir: the kubelet makes it 0777, and only this pod mounts it
NODE_SCRATCH_DIR = f"{SCRATCH_DIR}/node"  # the node's private scratch, made in it by the agent
RANK_RECORDS = "ranks"
WORKDIR = "/app"
GPU_RESOURCE = "nvidia.com/gpu"
SECRET_ENV_KEY = "env.{name}"  # the worker-config Secret's key holding a workload.secret_env value


@dataclass(frozen=True)
class NodeIdentity:
    """How a pod finds its node's worker config: env vars from the downward API, then the key."""

    env: tuple[dict, ...]
    config_key: str


def completion_index_identity() -> NodeIdentity:
    """Indexed Job and JobSet pods: the completion index is the node."""
    index = {
        "name": "TRAINFLOW_NODE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}},
    }
    return NodeIdentity((index,), "node-$(TRAINFLOW_NODE).json")


def cpu_quantity(cores: float) -> str:
    millis = round(cores * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def resources(spec: RunSpec) -> dict:
    """Requests equal limits (Guaranteed QoS: the last pods the kubelet evicts under pressure)."""
    amounts = {"cpu": cpu_quantity(spec.resources.cpu), "memory": spec.resources.memory}
    if spec.resources.gpu:
        amounts[GPU_RESOURCE] = str(spec.resources.gpu)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def agent_command(spec: RunSpec, rendezvous_host: str, rendezvous_id: str) -> list[str]:
    """torchrun's command line, run by trainflow's node agent (as on the other backends)."""
    return [
        "python",
        "-m",
        "trainflow.backends.agent",
        "--nnodes",
        str(spec.resources.nodes),
        "--nproc-per-node",
        str(spec.resources.procs_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{rendezvous_host}:{RENDEZVOUS_PORT}",
        "--rdzv-id",
        rendezvous_id,
        "--max-restarts",
        "0",  # restarts belong to the flow, which restores a verified checkpoint
        "--monitor-interval",
        "0.1",
        spec.workload.entrypoint,
        *spec.workload.args,
    ]


def environment(spec: RunSpec, run_id: str, identity: NodeIdentity) -> list[dict]:
    threads = max(1, int(spec.resources.cpu // spec.resources.procs_per_node))
    return [
        {"name": JOB_ENV, "value": run_id},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "OMP_NUM_THREADS", "value": str(threads)},
        # the agent's record of its ranks' exits: no copy of a plain script's folder after a rank failed
        {"name": RECORDS_ENV, "value": f"{NODE_SCRATCH_DIR}/{RANK_RECORDS}"},
        *identity.env,
        # $(VAR) expands variables defined earlier in this list, so the key is the pod's own
        {"name": CONFIG_ENV, "value": f"{CONFIG_DIR}/{identity.config_key}"},
    ]


def secret_env_refs(spec: RunSpec, names: RunNames, attempt: int) -> list[dict]:
    """workload.secret_env as references into the attempt's Secret: no value in the pod spec."""
    return [
        {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": names.config(attempt), "key": SECRET_ENV_KEY.format(name=name)}},
        }
        for name in spec.workload.secret_env
    ]


def config_keys(api: LaunchApi, nodes: int) -> dict[str, int]:
    """The worker-config Secret's key each node reads its worker config from."""
    if api == LaunchApi.pytorchjob:
        return {"master-0.json": 0, **{f"worker-{i}.json": i + 1 for i in range(nodes - 1)}}
    return {f"node-{i}.json": i for i in range(nodes)}


def affinity(spec: RunSpec, names: RunNames, attempt: int) -> dict | None:
    """All nodes of an attempt in one topology domain (zone, rack...) of `kubernetes.topology_key`."""
    if not kubernetes_config(spec).topology_key:
        return None
    peers = {"matchLabels": {LABEL_RUN: names.base, LABEL_ATTEMPT: str(attempt)}}
    term = {"labelSelector": peers, "topologyKey": kubernetes_config(spec).topology_key}
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def volumes(spec: RunSpec, names: RunNames, attempt: int) -> list[dict]:
    scratch: dict = {}
    if kubernetes_config(spec).local_tier_volume:
        scratch["sizeLimit"] = kubernetes_config(spec).local_tier_volume
    return [
        # the default mode: the image runs as a non-root user, and nothing else shares the pod
        {
            "name": "worker-config",
            "secret": {
                "secretName": names.config(attempt),
                "items": [
                    {"key": key, "path": key}
                    for key in config_keys(kubernetes_config(spec).launch_api, spec.resources.nodes)
                ],
            },
        },
        {"name": "local-tier", "emptyDir": scratch},
        # the default 64 MiB /dev/shm is too small for data loader workers and NCCL
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]


def pod_template(
    spec: RunSpec,
    run_id: str,
    attempt: int,
    image: str,
    command: list[str],
    identity: NodeIdentity,
    container: str = CONTAINER,
    port_name: str = "rendezvous",
    subdomain: str | None = None,
) -> dict:
    names = RunNames(run_id)
    k8s = kubernetes_config(spec)
    main = {
        "name": container,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": WORKDIR,
        "command": command,
        "env": environment(spec, run_id, identity) + secret_env_refs(spec, names, attempt),
        "ports": [{"name": port_name, "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}],
        "resources": resources(spec),
        "volumeMounts": [
            {"name": "worker-config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "local-tier", "mountPath": SCRATCH_DIR},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if k8s.s3_secret:
        main["envFrom"] = [{"secretRef": {"name": k8s.s3_secret}}]
    pod: dict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": math.ceil(spec.fault_tolerance.preemption_grace_s),
        "automountServiceAccountToken": False,  # workers never talk to the Kubernetes API
        "enableServiceLinks": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [main],
        "volumes": volumes(spec, names, attempt),
    }
    if subdomain:
        pod["subdomain"] = subdomain
    if k8s.service_account:
        pod["serviceAccountName"] = k8s.service_account
    if k8s.node_selector:
        pod["nodeSelector"] = dict(k8s.node_selector)
    if k8s.tolerations:
        pod["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in k8s.tolerations]
    if k8s.registry_secret:
        pod["imagePullSecrets"] = [{"name": k8s.registry_secret}]
    placement = affinity(spec, names, attempt)
    if placement:
        pod["affinity"] = placement
    return {
        "metadata": {"labels": names.labels(WORKERS, attempt), "annotations": names.annotations()},
        "spec": pod,
    }
