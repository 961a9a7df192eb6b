"""Outcome kinds, how an ended attempt is classified, and which outcomes are worth a retry."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import Enum

from trainflow.backends.base import NodeExit
from trainflow.spec import FaultTolerance
from trainflow.runtime.reporter import EXIT_ORCHESTRATOR_LOST
from trainflow.status import AttemptStatus

INFRA_ERRORS = {"StorageError", "CheckpointInvalid", "ManifestError", "DistNetworkError", "DistStoreError"}


class Outcome(str, Enum):
    SUCCEEDED = "SUCCEEDED"
    CRASHED = "CRASHED"
    KILLED = "KILLED"
    HUNG = "HUNG"
    NODE_LOST = "NODE_LOST"
    PREEMPTED = "PREEMPTED"
    DIVERGED = "DIVERGED"
    USER_ERROR = "USER_ERROR"
    INFRA = "INFRA"
    CANCELLED = "CANCELLED"



@dataclass
class AttemptResult:
    attempt: int
    outcome: Outcome
    reason: str
    world_size: int
    started_at: float
    ended_at: float
    detected_at: float
    failed_at: float | None
    last_step: int
    resumed_from_step: int
    first_step_at: float | None = None
    finished: dict | None = None
    step_time_total_s: float = 0.0
    totals: dict = field(default_factory=dict)  # sums over the attempt's steps: step, comm, data, stalls
    evidence: dict = field(default_factory=dict)

    @property
    def detection_latency_s(self) -> float | None:
        return None if self.failed_at is None else max(0.0, self.detected_at - self.failed_at)


PEER_FAILURE_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker crashing",
    "Broken pipe",
    "NCCL communicator was aborted",
)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def is_peer_failure(error: dict) -> bool:
    """An error a rank raised only because another rank went away: a symptom, not the cause."""
    message = str(error.get("message", ""))
    return any(sign in message for sign in PEER_FAILURE_SIGNS)


def classify_exit(exits: list[NodeExit], status: AttemptStatus) -> tuple[Outcome, str]:
    """The outcome of an attempt that ended because its processes exited."""
    failed = [e for e in exits if e.failing]
    if not failed:
        if status.finished is not None:
            return Outcome.SUCCEEDED, f"finished at step {status.finished['step']}"
        return Outcome.USER_ERROR, "workers exited 0 without finishing (did the script call run.finish()?)"
    if status.diverged is not None:
        hashes = status.diverged.get("hashes")
        return Outcome.DIVERGED, f"replicas diverged at step {status.diverged.get('step')} (parameter hashes {hashes})"
    if status.preempted is not None:
        # a backend's evidence of who sent the SIGTERM (Slurm: the time limit's warning)
        hints = [getattr(e, "reason", "") for e in exits if getattr(e, "outcome", None) == Outcome.PREEMPTED]
        sender = next((hint for hint in hints if hint), "")
        return Outcome.PREEMPTED, (
            f"preempted (SIGTERM to rank {status.preempted.get('rank')}): emergency checkpoint at step "
            f"{status.preempted.get('step')} committed" + (f"; {sender}" if sender else "")
        )
    causes = [e for e in status.errors if not is_peer_failure(e)]
    if causes:
        error = causes[0]
        kind = Outcome.INFRA if error.get("type") in INFRA_ERRORS else Outcome.USER_ERROR
        return kind, f"rank {error.get('rank')} raised {error.get('type')} at step {error.get('step')}: {error.get('message')}"
    for node_exit in sorted(failed, key=lambda e: e.node):
        hinted = getattr(node_exit, "outcome", None)  # a backend's own evidence (a pod OOMKilled, evicted)
        if hinted is not None:
            return hinted, f"node {node_exit.node}: {getattr(node_exit, 'reason', '') or hinted.value}"
    symptomatic = {e.get("node") for e in status.errors}
    first = next((e for e in failed if e.node not in symptomatic), None)
    if first is None:
        return Outcome.INFRA, f"communication failed between nodes: {status.errors[0].get('message', '')[:300]}"
    code = first.worker_returncode if first.worker_returncode is not None else first.returncode
    if code == EXIT_ORCHESTRATOR_LOST:
        return Outcome.INFRA, f"node {first.node} lost the orchestrator"
    if code is not None and code < 0:
        kind = Outcome.KILLED if -code == signal.SIGKILL else Outcome.CRASHED  # SIGKILL: the OOM killer's
        return kind, f"a worker on node {first.node} was killed by {signal_name(-code)}"
    if code is None:
        return Outcome.CRASHED, f"a worker on node {first.node} died"
    return Outcome.CRASHED, f"node {first.node} exited with code {code}"


@dataclass(frozen=True)
class Decision:
    retry: bool
    reason: str
    backoff_s: float = 0.0


def budget_for(outcome: Outcome, policy: FaultTolerance) -> tuple[str, int]:
    """Which budget an outcome draws on: preemptions, infrastructure and user errors have their own."""
    if outcome == Outcome.PREEMPTED:
        return "preemption", policy.max_preemptions
    if outcome == Outcome.INFRA:
        return "infrastructure", policy.max_infra_failures
    if outcome == Outcome.USER_ERROR:
        return "user-error", policy.max_user_errors
    return "restart", policy.max_restarts


def decide(policy: FaultTolerance, results: list[AttemptResult]) -> Decision:
    """After an attempt ends: take the retry branch, or finish (succeeded or failed) and say why."""
    last = results[-1]
    if last.outcome == Outcome.SUCCEEDED:
        return Decision(False, last.reason)
    if last.outcome.value not in {kind.value for kind in policy.retry_on}:
        return Decision(False, f"{last.outcome.value} is not retried: {last.reason}")
    if len(results) >= 2 and last.outcome != Outcome.PREEMPTED:
        previous = results[-2]
        if previous.outcome == last.outcome and previous.last_step == last.last_step:
            return Decision(
                False, f"crash loop: {last.outcome.value} twice at step {last.last_step}, stopping ({last.reason})"
            )
    name, budget = budget_for(last.outcome, policy)
    used = sum(1 for r in results if budget_for(r.outcome, policy)[0] == name)
    if used > budget:
        return Decision(False, f"{name} budget spent ({budget}): {last.outcome.value}: {last.reason}")
    backoff = 0.0
    retries = sum(1 for r in results if r.outcome != Outcome.PREEMPTED)
    # an isolated failure is retried at once; repeated ones back off; a reclaimed machine never waits
    if last.outcome != Outcome.PREEMPTED and retries > 1:
        backoff = min(policy.backoff_max_s, policy.backoff_s * 2 ** (retries - 2))
    return Decision(True, f"{last.outcome.value}: {last.reason}; {name} retry {used} of {budget}", backoff)
