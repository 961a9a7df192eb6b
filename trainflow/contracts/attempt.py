"""What one attempt left behind when it ended, as the watcher saw it."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainflow.contracts.outcome import Outcome


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
    totals: dict = field(default_factory=dict)  # sums over rank 0's reported steps: steps, step, comm, data, stalls
    evidence: dict = field(default_factory=dict)

    @property
    def detection_latency_s(self) -> float | None:
        return None if self.failed_at is None else max(0.0, self.detected_at - self.failed_at)
