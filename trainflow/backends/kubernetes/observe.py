"""Following an attempt's pods over time: one PodExit per node from each fresh look at the cluster.

What a single status cannot say needs memory: a pull error that persists past its patience, a pod
that vanished (deleted by the taint manager or pod GC) after it was seen running, a Job that
failed before some of its pods ever existed.
"""

from __future__ import annotations

from trainflow.backends.kubernetes.classify import (
    NEVER_STARTED,
    VANISHED,
    PodExit,
    PodVerdict,
    classify_job_failure,
    classify_pod,
    job_waiting,
    node_index,
)
from trainflow.contracts import Outcome


class PodObserver:
    def __init__(self, nodes: int, container: str, memory_limit: str | None = None, pull_patience_s: float = 120.0):
        self.nodes = nodes
        self.container = container
        self.memory_limit = memory_limit
        self.pull_patience_s = pull_patience_s
        self.last: dict[int, PodVerdict] = {}
        self.waiting: str | None = None
        self._stuck_since: dict[int, float] = {}

    def update(self, pods: list[dict], jobs: list[dict], now: float) -> list[PodExit]:
        """`pods` and `jobs` of the attempt as just listed; `now` in seconds (any monotonic clock)."""
        newest: dict[int, dict] = {}
        for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or ""):
            node = node_index(pod)
            if node is not None and 0 <= node < self.nodes:
                newest[node] = pod
        job_failure = next((f for f in map(classify_job_failure, jobs) if f is not None), None)
        self.waiting = next((w for w in map(job_waiting, jobs) if w is not None), None)
        return [
            self._observe(node, newest[node], now) if node in newest else self._missing(node, job_failure)
            for node in range(self.nodes)
        ]

    def _observe(self, node: int, pod: dict, now: float) -> PodExit:
        verdict = classify_pod(pod, self.container, self.memory_limit)
        self.last[node] = verdict
        if verdict.stuck:
            since = self._stuck_since.setdefault(node, now)
            if now - since >= self.pull_patience_s:
                reason = f"{verdict.reason} (for {now - since:.0f}s)"
                return PodExit(node, NEVER_STARTED, verdict.outcome, reason, verdict.pod)
            return PodExit(node, None, None, verdict.reason, verdict.pod)
        self._stuck_since.pop(node, None)
        if not verdict.ended:
            return PodExit(node, None, None, verdict.reason, verdict.pod)
        code = verdict.exit_code
        if code is None:
            code = VANISHED if verdict.started else NEVER_STARTED
        return PodExit(node, code, verdict.outcome, verdict.reason, verdict.pod)

    def _missing(self, node: int, job_failure: tuple[Outcome | None, str] | None) -> PodExit:
        last = self.last.get(node)
        if last is None:
            if job_failure is not None:
                return PodExit(node, VANISHED, None, f"the Job failed before this node's pod ran ({job_failure[1]})")
            return PodExit(node, None, None, self.waiting or "no pod yet")
        if last.ended:
            code = last.exit_code if last.exit_code is not None else VANISHED
            return PodExit(node, code, last.outcome, last.reason, last.pod)
        if last.outcome is not None:  # a disruption it was already marked with
            return PodExit(node, VANISHED, last.outcome, f"pod {last.pod} is gone: {last.reason}", last.pod)
        if job_failure is not None:  # deleted by the Job controller because another pod failed: a symptom
            return PodExit(node, VANISHED, None, f"pod {last.pod} was deleted when the Job failed", last.pod)
        return PodExit(node, VANISHED, Outcome.NODE_LOST, f"pod {last.pod} disappeared while {last.reason}", last.pod)
