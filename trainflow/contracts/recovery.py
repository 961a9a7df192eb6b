"""Where a recovery's time goes: from the failure's detection to the next attempt's first step,
split into phases at the timestamps the attempts record.

    stop              detection -> the failed attempt's processes all ended (release)
    between_attempts  -> the next attempt launched (record, classify, back off, recover nodes, launch task)
    launch            -> the last rank's process started (the launcher, torchrun's agent and its spawn or fork)
    imports           -> the last rank called trainflow.runtime.init() (torch, the script's modules)
    rendezvous        -> the last rank joined the process group
    restore           -> the last rank restored its state (building the model included)
    first_step        -> the attempt's first step reported

Each point is the slowest rank's: the next phase waits for every rank. A point that was not
recorded (a plain torchrun script, a fresh start without a checkpoint) gives its phase as None
and its time to the next phase, so the phases present always sum to the recovery time.
"""

from __future__ import annotations

from pydantic import BaseModel

from trainflow.contracts.attempt import AttemptResult

PHASES = ("stop", "between_attempts", "launch", "imports", "rendezvous", "restore", "first_step")


class RecoveryPhases(BaseModel):
    """Seconds of one recovery per phase (module docstring); None where a point is missing."""

    stop: float | None
    between_attempts: float | None
    launch: float | None
    imports: float | None
    rendezvous: float | None
    restore: float | None
    first_step: float | None

    def as_metrics(self) -> dict[str, float]:
        """The phases present, named as MLflow metrics: recovery_<phase>_s."""
        return {f"recovery_{name}_s": value for name, value in self.model_dump().items() if value is not None}


def recovery_phases(failed: AttemptResult, next_attempt: AttemptResult) -> RecoveryPhases | None:
    """The split of the recovery from `failed` into `next_attempt`; None when it never reached a step."""
    if next_attempt.first_step_at is None:
        return None
    marks = next_attempt.milestones
    points = (
        failed.stopped_at,
        next_attempt.started_at,
        marks.process_started_at,
        marks.imported_at,
        marks.rendezvous_at,
        marks.restored_at,
        next_attempt.first_step_at,
    )
    phases: dict[str, float | None] = {}
    previous = failed.detected_at
    for name, point in zip(PHASES, points):
        if point is None:
            phases[name] = None
            continue
        point = max(point, previous)  # clocks of other processes; a phase is never negative
        phases[name] = round(point - previous, 3)
        previous = point
    return RecoveryPhases(**phases)
