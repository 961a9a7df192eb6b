"""One recovery in place: a rank's exception, and every rank going back to the in-memory copy of
the same step in the processes it already had (runtime/in_place.py), within the attempt."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trainflow.contracts.outcome import Outcome


@dataclass(frozen=True)
class InPlaceRestart:
    round: int  # 1 for an attempt's first recovery in place, 2 for its second...
    outcome: Outcome  # the failure as the orchestrator classifies it: the budget it draws on
    reason: str  # the cause, as a rank reported it
    cause_rank: int
    failed_step: int  # the step in progress when it failed
    restored_step: int  # the step of the in-memory copy every rank went back to
    failed_at: float
    resumed_at: float  # every rank had its state back and trained a step (the slowest rank's report)
    ranks_kept: int  # rank processes that went on
    ranks_replaced: int = 0  # rank processes started anew
    copy_every_steps: int = 1  # the memory copies' cadence when it failed
    phases: dict[str, float] = field(default_factory=dict)  # abort_s, rejoin_s, restore_s: slowest rank's

    @property
    def lost_steps(self) -> int:
        """Steps finished after the copy and trained again (the failed step itself not counted)."""
        return max(0, self.failed_step - 1 - self.restored_step)

    @property
    def recovery_s(self) -> float:
        return max(0.0, self.resumed_at - self.failed_at)

    def as_dict(self) -> dict:
        return {**asdict(self), "outcome": self.outcome.value, "lost_steps": self.lost_steps}
