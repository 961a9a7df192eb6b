"""Pod and Job statuses in the shapes the Kubernetes API returns them (as documented: "Pod
Lifecycle", "Disruptions: pod disruption conditions", "Assign Memory Resources", "Images",
"Handling retriable and non-retriable pod failures with Pod failure policy").

Each builder returns a whole pod of attempt 1 of run `digits-k8s-x`, node `node`, so tests feed
them to the classifier and to a fake cluster alike.
"""

from __future__ import annotations

import copy

RUN = "digits-k8s-x"
NAMESPACE = "trainflow"
STARTED = "2025-06-01T10:00:00Z"
FINISHED = "2025-06-01T10:05:00Z"


def pod(node: int, status: dict, attempt: int = 1, container: str = "trainer", created: str = STARTED) -> dict:
    job = f"{RUN}-a{attempt}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{node}-x7k2p",
            "namespace": NAMESPACE,
            "creationTimestamp": created,
            "labels": {
                "app.kubernetes.io/managed-by": "trainflow",
                "trainflow.dev/run": RUN,
                "trainflow.dev/component": "workers",
                "trainflow.dev/attempt": str(attempt),
                "batch.kubernetes.io/job-completion-index": str(node),
                "batch.kubernetes.io/job-name": job,
                "job-name": job,
            },
            "annotations": {"batch.kubernetes.io/job-completion-index": str(node)},
        },
        "spec": {"containers": [{"name": container, "image": "registry.example.com/ml/trainflow:tf-cpu-1"}]},
        "status": copy.deepcopy(status),
    }


def _container(state: dict, name: str = "trainer", ready: bool = False) -> dict:
    return {
        "name": name,
        "state": state,
        "lastState": {},
        "ready": ready,
        "restartCount": 0,
        "image": "registry.example.com/ml/trainflow:tf-cpu-1",
        "imageID": "",
        "started": ready,
    }


def _conditions(*extra: dict, ready: str = "False") -> list[dict]:
    return [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": STARTED},
        {"type": "Initialized", "status": "True", "lastTransitionTime": STARTED},
        {"type": "Ready", "status": ready, "lastTransitionTime": STARTED},
        {"type": "ContainersReady", "status": ready, "lastTransitionTime": STARTED},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": STARTED},
        *extra,
    ]


def running(node: int = 0, **kw) -> dict:
    status = {
        "phase": "Running",
        "conditions": _conditions(ready="True"),
        "podIP": f"10.8.0.{10 + node}",
        "containerStatuses": [_container({"running": {"startedAt": STARTED}}, ready=True)],
    }
    return pod(node, status, **kw)


def succeeded(node: int = 0, **kw) -> dict:
    terminated = {"exitCode": 0, "reason": "Completed", "startedAt": STARTED, "finishedAt": FINISHED}
    status = {
        "phase": "Succeeded",
        "conditions": _conditions(),
        "containerStatuses": [_container({"terminated": terminated})],
    }
    return pod(node, status, **kw)


def exited(node: int = 0, code: int = 1, reason: str = "Error", message: str | None = None, **kw) -> dict:
    terminated = {"exitCode": code, "reason": reason, "startedAt": STARTED, "finishedAt": FINISHED}
    if message:
        terminated["message"] = message
    status = {
        "phase": "Failed",
        "conditions": _conditions(),
        "containerStatuses": [_container({"terminated": terminated})],
    }
    return pod(node, status, **kw)


def oom_killed(node: int = 0, **kw) -> dict:
    return exited(node, 137, "OOMKilled", **kw)


def evicted(node: int = 0, **kw) -> dict:
    message = (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 40Mi. Container trainer "
        "was using 2500Mi, request is 2Gi, has larger consumption of memory. "
    )
    terminated = {
        "exitCode": 137,
        "reason": "ContainerStatusUnknown",
        "message": "The container could not be located when the pod was terminated",
        "startedAt": STARTED,
        "finishedAt": FINISHED,
    }
    disruption = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "TerminationByKubelet",
        "message": message,
        "lastTransitionTime": FINISHED,
    }
    status = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": message,
        "conditions": _conditions(disruption),
        "containerStatuses": [_container({"terminated": terminated})],
    }
    return pod(node, status, **kw)


def disrupted(node: int = 0, reason: str = "PreemptionByScheduler", ended: bool = True, **kw) -> dict:
    """A pod with the DisruptionTarget condition: still in its grace period, or ended with SIGTERM's code."""
    messages = {
        "PreemptionByScheduler": "default-scheduler: preempting to accommodate a higher priority pod",
        "DeletionByTaintManager": "Taint manager: deleting due to NoExecute taint",
        "EvictionByEvictionAPI": "Eviction API: evicting",
        "DeletionByPodGC": "PodGC: node no longer exists",
    }
    disruption = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": messages.get(reason, reason),
        "lastTransitionTime": FINISHED,
    }
    if ended:
        terminated = {"exitCode": 143, "reason": "Error", "startedAt": STARTED, "finishedAt": FINISHED}
        state, phase = {"terminated": terminated}, "Failed"
    else:
        state, phase = {"running": {"startedAt": STARTED}}, "Running"
    status = {"phase": phase, "conditions": _conditions(disruption), "containerStatuses": [_container(state)]}
    doc = pod(node, status, **kw)
    doc["metadata"]["deletionTimestamp"] = FINISHED
    doc["metadata"]["deletionGracePeriodSeconds"] = 30
    return doc


def waiting(node: int = 0, reason: str = "ContainerCreating", message: str | None = None, **kw) -> dict:
    state = {"waiting": {"reason": reason}}
    if message:
        state["waiting"]["message"] = message
    status = {"phase": "Pending", "conditions": _conditions(), "containerStatuses": [_container(state)]}
    return pod(node, status, **kw)


IMAGE = "registry.example.com/ml/trainflow:tf-cpu-1"
PULL_NOT_FOUND = (
    f'rpc error: code = NotFound desc = failed to pull and unpack image "{IMAGE}": failed to resolve reference '
    f'"{IMAGE}": {IMAGE}: not found'
)
PULL_DENIED = (
    f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": pull access denied, '
    "repository does not exist or may require authorization: server message: insufficient_scope: authorization failed"
)
PULL_TIMEOUT = (
    f'rpc error: code = Unknown desc = failed to pull and unpack image "{IMAGE}": failed to copy: httpReadSeeker: '
    'failed open: failed to do request: Get "https://registry.example.com/v2/...": dial tcp 10.0.0.5:443: i/o timeout'
)
BACKOFF = f'Back-off pulling image "{IMAGE}"'


def image_pull_error(node: int = 0, message: str = PULL_NOT_FOUND, **kw) -> dict:
    return waiting(node, "ErrImagePull", message, **kw)


def image_pull_backoff(node: int = 0, message: str = BACKOFF, **kw) -> dict:
    return waiting(node, "ImagePullBackOff", message, **kw)


def config_error(node: int = 0, **kw) -> dict:
    return waiting(node, "CreateContainerConfigError", 'secret "trainflow-s3" not found', **kw)


def unschedulable(node: int = 0, **kw) -> dict:
    scheduled = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "lastTransitionTime": STARTED,
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
        "3 No preemption victims found for incoming pod.",
    }
    return pod(node, {"phase": "Pending", "conditions": [scheduled]}, **kw)


def node_unknown(node: int = 0, **kw) -> dict:
    status = {
        "phase": "Unknown",
        "conditions": _conditions(ready="False"),
        "containerStatuses": [_container({"running": {"startedAt": STARTED}})],
    }
    return pod(node, status, **kw)


def job(attempt: int = 1, failed: dict | None = None, suspended: bool = False) -> dict:
    conditions = []
    if failed is not None:
        conditions = [
            {"type": "FailureTarget", "status": "True", **failed},
            {"type": "Failed", "status": "True", **failed},
        ]
    if suspended:
        conditions.append({"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{RUN}-a{attempt}",
            "namespace": NAMESPACE,
            "labels": {"trainflow.dev/run": RUN, "trainflow.dev/attempt": str(attempt)},
        },
        "spec": {"suspend": suspended},
        "status": {"conditions": conditions, "failed": 1 if failed else 0},
    }


def failed_by_policy(rule: int, code: int, attempt: int = 1) -> dict:
    message = (
        f"Container trainer for pod {NAMESPACE}/{RUN}-a{attempt}-2-x7k2p failed with exit code {code} "
        f"matching FailJob rule at index {rule}"
    )
    return job(attempt, failed={"reason": "PodFailurePolicy", "message": message})
