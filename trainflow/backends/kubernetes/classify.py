"""What a pod's status says about why a node of an attempt stopped, as trainflow outcomes.

Reads pod and Job status exactly as the API returns them (camelCase dicts), so recorded statuses
can be fed to it in tests. An outcome is set only when the pod itself is the evidence (out of
memory, evicted, preempted, node lost, image or configuration problems); a plain non-zero exit
leaves the outcome to the workers' own reports, which say more (`trainflow.orchestrator.failures`).

The same table drives the Job's podFailurePolicy, so the Job's failure message and trainflow's
classification name the same rule.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from trainflow.backends.base import NodeExit
from trainflow.contracts import Outcome, exit_codes

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"

NEVER_STARTED = 125  # returncode of a node whose container never ran (image or configuration problem)
VANISHED = 128 + signal.SIGKILL  # returncode of a node whose pod disappeared without an exit code


@dataclass(frozen=True)
class FailureRule:
    """One podFailurePolicy rule and the outcome trainflow gives a pod that matches it."""

    name: str
    outcome: Outcome
    exit_codes: tuple[int, ...] = ()
    on_disruption: bool = False

    def as_policy_rule(self, container: str) -> dict:
        if self.on_disruption:
            return {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
        if self.exit_codes:
            values = sorted(self.exit_codes)
            return {
                "action": "FailJob",
                "onExitCodes": {"containerName": container, "operator": "In", "values": values},
            }
        return {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "NotIn", "values": [0]}}


# Retries belong to the flow (backoffLimit 0), so every rule fails the Job at once; the rule index
# in the Job's failure message still tells which kind of failure it was after the pods are gone.
FAILURE_RULES: tuple[FailureRule, ...] = (
    FailureRule("disrupted", Outcome.PREEMPTED, on_disruption=True),
    FailureRule("preempted", Outcome.PREEMPTED, exit_codes=(exit_codes.PREEMPTED,)),
    FailureRule("orchestrator-lost", Outcome.INFRA, exit_codes=(exit_codes.ORCHESTRATOR_LOST,)),
    FailureRule("diverged", Outcome.DIVERGED, exit_codes=(exit_codes.DIVERGED,)),
    FailureRule("killed", Outcome.KILLED, exit_codes=tuple(128 + s for s in (1, 2, 9, 15))),
    FailureRule("crashed", Outcome.CRASHED),
)


def pod_failure_policy(container: str) -> dict:
    return {"rules": [rule.as_policy_rule(container) for rule in FAILURE_RULES]}


# Reasons of the DisruptionTarget condition, as documented under "Pod disruption conditions".
DISRUPTIONS: dict[str, tuple[Outcome, str]] = {
    "PreemptionByScheduler": (Outcome.PREEMPTED, "preempted by the scheduler for a higher-priority pod"),
    "EvictionByEvictionAPI": (Outcome.PREEMPTED, "evicted through the Eviction API (node drain or scale-down)"),
    "DeletionByTaintManager": (
        Outcome.NODE_LOST,
        "deleted because its node is tainted NoExecute (not ready or unreachable)",
    ),
    "DeletionByPodGC": (Outcome.NODE_LOST, "deleted by the pod garbage collector: its node no longer exists"),
    "TerminationByKubelet": (Outcome.PREEMPTED, "terminated by the kubelet (node shutdown or resource pressure)"),
}

IMAGE_PULL_WAITING = {"ErrImagePull", "ImagePullBackOff"}
# A pull that fails like this will fail again: the reference or the credentials are wrong.
IMAGE_PULL_USER_SIGNS = (
    "not found",
    "manifest unknown",
    "repository does not exist",
    "pull access denied",
    "unauthorized",
    "authentication required",
    "denied",
    "invalid reference format",
)
USER_WAITING = {
    "InvalidImageName": "the image reference is not valid; check kubernetes.image",
    "CreateContainerConfigError": "the pod's configuration refers to something missing "
    "(a Secret or ConfigMap: check kubernetes.s3_secret and kubernetes.registry_secret)",
}
TRANSIENT_WAITING = {"CreateContainerError", "RunContainerError"}
USER_TERMINATED = {"StartError", "ContainerCannotRun"}


@dataclass(frozen=True)
class PodVerdict:
    """One pod of an attempt, read once."""

    pod: str
    node: int | None
    phase: str
    ended: bool
    exit_code: int | None
    outcome: Outcome | None
    reason: str
    stuck: bool = False  # waiting on something the kubelet retries, which may or may not clear
    started: bool = False


@dataclass(frozen=True)
class PodExit(NodeExit):
    """A node's exit as seen from its pod: the container's exit code and, when the pod itself is
    the evidence, the outcome it implies."""

    outcome: Outcome | None = None
    reason: str = ""
    pod: str = ""


def node_index(pod: dict) -> int | None:
    """Which node of the attempt a pod runs: the Job completion index, or the PyTorchJob replica."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    index = annotations.get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX))
    if index is not None:
        return int(index)
    if REPLICA_TYPE in labels:
        replica = int(labels.get(REPLICA_INDEX, 0))
        return replica if labels[REPLICA_TYPE].lower() == "master" else replica + 1
    return None


def _condition(pod: dict, kind: str) -> dict | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def _container(pod: dict, container: str | None) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if container is None or status.get("name") == container:
            return status
    return statuses[0] if statuses else {}


def _disruption(pod: dict) -> tuple[Outcome, str] | None:
    condition = _condition(pod, "DisruptionTarget")
    if condition is None:
        return None
    reason = condition.get("reason", "")
    outcome, text = DISRUPTIONS.get(reason, (Outcome.PREEMPTED, f"disrupted ({reason or 'no reason given'})"))
    if (pod.get("status") or {}).get("reason") == "Evicted":
        return Outcome.INFRA, _evicted_text(pod)
    message = condition.get("message")
    return outcome, f"{text}: {message}" if message else text


def _evicted_text(pod: dict) -> str:
    message = (pod.get("status") or {}).get("message") or "no message"
    return f"evicted by the kubelet under node pressure: {message}"


def _signal_text(code: int) -> str | None:
    if 128 < code < 128 + 65:
        try:
            return signal.Signals(code - 128).name
        except ValueError:
            return f"signal {code - 128}"
    return None


def _image_pull(message: str) -> tuple[Outcome, bool]:
    """(outcome, stuck): a wrong reference or missing credentials is the user's to fix; anything
    else (registry down, rate limit, network) may clear, so the kubelet's retries get time."""
    lowered = message.lower()
    if any(sign in lowered for sign in IMAGE_PULL_USER_SIGNS):
        return Outcome.USER_ERROR, False
    return Outcome.INFRA, True


def classify_pod(pod: dict, container: str | None = None, memory_limit: str | None = None) -> PodVerdict:
    """What one pod's status says: still going, ended, and the outcome its status alone implies."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    name = meta.get("name", "?")
    phase = status.get("phase", "Pending")
    node = node_index(pod)
    state = _container(pod, container).get("state") or {}
    disruption = _disruption(pod)

    def verdict(ended, exit_code, outcome, reason, stuck=False, started=False) -> PodVerdict:
        return PodVerdict(name, node, phase, ended, exit_code, outcome, reason, stuck, started)

    terminated = state.get("terminated")
    if terminated is not None:
        code = int(terminated.get("exitCode", 0))
        why = terminated.get("reason") or ""
        if code == 0:
            return verdict(True, 0, None, "exited 0", started=True)
        if why == "OOMKilled":
            limit = f" of {memory_limit}" if memory_limit else ""
            text = (
                f"out of memory: the container exceeded its memory limit{limit} (OOMKilled, exit {code}); "
                "raise resources.memory or lower the batch size"
            )
            return verdict(True, code, Outcome.USER_ERROR, text, started=True)
        if disruption is not None:
            return verdict(True, code, disruption[0], f"{disruption[1]} (exit {code})", started=True)
        if status.get("reason") == "Evicted":
            return verdict(True, code, Outcome.INFRA, _evicted_text(pod), started=True)
        if why in USER_TERMINATED:
            text = f"the container could not start ({why}): {terminated.get('message', '').strip()}"
            return verdict(True, code, Outcome.USER_ERROR, text)
        signal_name = _signal_text(code)
        text = f"exited with code {code}" + (f" ({signal_name})" if signal_name else "") + (f", {why}" if why else "")
        return verdict(True, code, None, text, started=True)

    if phase == "Failed":
        if disruption is not None:
            return verdict(True, None, disruption[0], disruption[1])
        if status.get("reason") == "Evicted":
            return verdict(True, None, Outcome.INFRA, _evicted_text(pod))
        text = f"the kubelet failed the pod ({status.get('reason', 'no reason')}): {status.get('message', '')}".strip()
        return verdict(True, None, Outcome.INFRA, text)
    if phase == "Unknown":
        return verdict(True, None, Outcome.NODE_LOST, "its node stopped reporting (pod phase Unknown)")
    if phase == "Succeeded":
        return verdict(True, 0, None, "succeeded", started=True)

    waiting = state.get("waiting")
    if waiting is not None:
        why = waiting.get("reason") or ""
        message = waiting.get("message") or ""
        if why in IMAGE_PULL_WAITING:
            outcome, stuck = _image_pull(message)
            text = f"cannot pull the image ({why}): {message}"
            if outcome == Outcome.USER_ERROR:
                text += "; check kubernetes.image and kubernetes.registry_secret"
            return verdict(not stuck, None, outcome, text, stuck=stuck)
        if why in USER_WAITING:
            return verdict(True, None, Outcome.USER_ERROR, f"{USER_WAITING[why]} ({why}: {message})")
        if why in TRANSIENT_WAITING:
            text = f"the container runtime cannot start it ({why}): {message}"
            return verdict(False, None, Outcome.INFRA, text, stuck=True)

    if disruption is not None:  # still running out its grace period
        return verdict(False, None, disruption[0], disruption[1], started=phase == "Running")
    if phase == "Running":
        return verdict(False, None, None, "running", started=True)
    unscheduled = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled" and c.get("status") == "False"),
        None,
    )
    if unscheduled is not None:
        return verdict(
            False, None, None, f"not scheduled ({unscheduled.get('reason')}): {unscheduled.get('message', '')}"
        )
    return verdict(False, None, None, f"pending ({(waiting or {}).get('reason', 'waiting to start')})")


_RULE_INDEX = re.compile(r"rule at index (\d+)")


def classify_job_failure(job: dict) -> tuple[Outcome | None, str] | None:
    """The Job's own account of its failure, or None while it has not failed. The outcome comes
    from the podFailurePolicy rule it names; other failures leave it to the pods (None)."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") != "Failed" or condition.get("status") != "True":
            continue
        message = condition.get("message", "")
        if condition.get("reason") == "PodFailurePolicy":
            match = _RULE_INDEX.search(message)
            if match and int(match.group(1)) < len(FAILURE_RULES):
                return FAILURE_RULES[int(match.group(1))].outcome, message
        return None, f"{condition.get('reason')}: {message}"
    return None


def job_waiting(job: dict) -> str | None:
    """Why a Job has no pods yet, if it says: suspended until Kueue admits it."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Suspended" and condition.get("status") == "True":
            return f"suspended ({condition.get('reason')}): waiting for admission by its queue"
    if (job.get("spec") or {}).get("suspend"):
        return "suspended: waiting for admission by its queue"
    return None


def pod_outcome(exits: list[NodeExit]) -> tuple[Outcome, str] | None:
    """The outcome pod-level evidence decides for an ended attempt, if any: out of memory,
    evicted, preempted, node lost, image or configuration problems. None: let the exit codes and
    the workers' reports decide (`trainflow.orchestrator.failures.classify_exit`)."""
    for node_exit in sorted(exits, key=lambda e: e.node):
        if isinstance(node_exit, PodExit) and not node_exit.running and node_exit.outcome is not None:
            return node_exit.outcome, f"node {node_exit.node} ({node_exit.pod}): {node_exit.reason}"
    return None
