"""What one attempt left behind when it ended, as the watcher saw it."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainflow.contracts.evidence import AttemptEvidence
from trainflow.contracts.in_place import InPlaceRestart
from trainflow.contracts.outcome import Outcome


@dataclass
class WorkerMilestones:
    """When the slowest rank of an attempt reached each point of its start-up (wall-clock seconds),
    as the workers report them; None where no rank reported it."""

    process_started_at: float | None = None  # the interpreter's own start
    imported_at: float | None = None  # trainflow.runtime.init() called: the script's imports are done
    rendezvous_at: float | None = None  # the process group joined
    restored_at: float | None = None  # the checkpoint restored

    def reached(self, name: str, at: float | None) -> None:
        """One rank reached point `name` at `at`: the attempt has once every rank has."""
        if at is not None:
            current = getattr(self, name)
            setattr(self, name, at if current is None else max(current, at))


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
    stopped_at: float | None = None  # every process of the attempt ended (set when it is released)
    milestones: WorkerMilestones = field(default_factory=WorkerMilestones)
    finished: dict | None = None
    totals: dict = field(default_factory=dict)  # sums over rank 0's reported steps: steps, step, comm, data, stalls
    evidence: AttemptEvidence = field(default_factory=AttemptEvidence)
    resumed_from: str | None = None  # a plain script: the copy of its own checkpoint restored (URI)
    in_place: list[InPlaceRestart] = field(default_factory=list)  # recoveries within the attempt

    @property
    def detection_latency_s(self) -> float | None:
        return None if self.failed_at is None else max(0.0, self.detected_at - self.failed_at)
