"""Watching one attempt: exits, heartbeats and progress, until it ends or something is wrong.

Processes that exit are noticed within one poll (0.1 s); a node whose heartbeats stop is lost
after `heartbeat_timeout_s`; ranks that keep sending heartbeats but stop advancing are hung after
the hang timeout (configured, or derived from observed step times with a floor).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainflow.backends import AttemptHandle, Launcher
from trainflow.failures import AttemptResult, Outcome, classify_exit
from trainflow.status import AttemptStatus, StatusServer

HANG_FLOOR_S = 30.0
HANG_STEP_FACTOR = 20.0
METRICS_FLUSH_S = 1.0
EXIT_EVIDENCE_S = 1.0  # after the first node exits, how long to wait for the others' exit codes


@dataclass(frozen=True)
class WatchLimits:
    heartbeat_timeout_s: float
    hang_timeout_s: float | None
    startup_timeout_s: float = 300.0

    def hang_after(self, status: AttemptStatus) -> float:
        if self.hang_timeout_s is not None:
            return self.hang_timeout_s
        slowest = max((r.step_time_s or 0.0 for r in status.ranks.values()), default=0.0)
        return max(HANG_FLOOR_S, HANG_STEP_FACTOR * slowest)


MetricRows = list[tuple[str, float, int, float]]


class AttemptWatcher:
    def __init__(
        self,
        launcher: Launcher,
        handle: AttemptHandle,
        channel: StatusServer,
        limits: WatchLimits,
        world_size: int,
        resumed_from_step: int,
        on_metrics: Callable[[MetricRows], None],
        on_event: Callable[[dict], None],
    ):
        self.launcher = launcher
        self.handle = handle
        self.channel = channel
        self.limits = limits
        self.world_size = world_size
        self.resumed_from_step = resumed_from_step
        self.on_metrics = on_metrics
        self.on_event = on_event
        self._pending: MetricRows = []
        self._flushed_at = time.monotonic()
        self.step_time_total = 0.0

    def run(self, poll_s: float = 0.1) -> AttemptResult:
        try:
            while True:
                self._pump()
                verdict = self._check()
                if verdict is not None:
                    return verdict
                time.sleep(poll_s)
        finally:
            self._pump()
            self._flush()

    def _check(self) -> AttemptResult | None:
        now = time.time()
        exits = self.launcher.poll(self.handle)
        status = self.channel.snapshot()
        ended = [e for e in exits if not e.running]
        if ended:
            if len(ended) < len(exits) and all(e.returncode == 0 for e in ended):
                return None  # the others are finishing too
            detected_at = now
            deadline = time.monotonic() + EXIT_EVIDENCE_S
            while any(e.running for e in exits) and time.monotonic() < deadline:
                time.sleep(0.05)
                exits = self.launcher.poll(self.handle)
            self._pump()
            status = self.channel.snapshot()
            outcome, reason = classify_exit(exits, status)
            failed_at = status.errors[0]["t"] if status.errors else None
            return self._result(outcome, reason, status, detected_at, failed_at, {"exit_codes": _codes(exits)})

        if not status.ranks:
            if now - self.handle.started_at > self.limits.startup_timeout_s:
                reason = f"no worker reported within {self.limits.startup_timeout_s:.0f}s of launch"
                return self._result(Outcome.INFRA, reason, status, now, None, {})
            return None

        for rank in status.ranks.values():
            silent = now - rank.last_seen
            if silent > self.limits.heartbeat_timeout_s:
                reason = f"node {rank.node} (rank {rank.rank}) silent for {silent:.1f}s without exiting"
                return self._result(Outcome.NODE_LOST, reason, status, now, rank.last_seen, {"node": rank.node})

        if len(status.ranks) == self.world_size:
            progressed = [r.progressed_at or status.started_at for r in status.ranks.values()]
            stalled_since = min(progressed)
            limit = self.limits.hang_after(status) if status.first_step_at else self.limits.startup_timeout_s
            if now - stalled_since > limit:
                stuck = sorted(r.rank for r in status.ranks.values() if (r.progressed_at or 0) <= stalled_since)
                reason = f"no step progress for {now - stalled_since:.1f}s (ranks {stuck}) while heartbeats continue"
                return self._result(Outcome.HUNG, reason, status, now, stalled_since, {"ranks": stuck})
        return None

    def _result(self, outcome, reason, status, detected_at, failed_at, evidence) -> AttemptResult:
        evidence = {**evidence, "errors": status.errors[:3], "logs": {n: str(p) for n, p in self.handle.logs.items()}}
        return AttemptResult(
            attempt=self.handle.attempt,
            outcome=outcome,
            reason=reason,
            world_size=self.world_size,
            started_at=self.handle.started_at,
            ended_at=time.time(),
            detected_at=detected_at,
            failed_at=failed_at,
            last_step=status.min_step() if status.ranks else self.resumed_from_step,
            resumed_from_step=self.resumed_from_step,
            first_step_at=status.first_step_at,
            finished=status.finished,
            step_time_total_s=self.step_time_total,
            evidence=evidence,
        )

    def _pump(self) -> None:
        while True:
            try:
                step, t, metrics = self.channel.metrics.get_nowait()
            except queue.Empty:
                break
            self.step_time_total += metrics.get("step_time_s", 0.0)
            self._pending.extend((key, value, step, t) for key, value in metrics.items())
        while True:
            try:
                self.on_event(self.channel.events.get_nowait())
            except queue.Empty:
                break
        if time.monotonic() - self._flushed_at > METRICS_FLUSH_S:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            rows, self._pending = self._pending, []
            self.on_metrics(rows)
        self._flushed_at = time.monotonic()


def _codes(exits) -> dict[int, int | None]:
    return {e.node: e.returncode for e in exits}
