"""Whether a round of in-process restart goes ahead: the orchestrator's rules, applied by rank 0 to
what the ranks reported (runtime/in_place.py). Pure: the same reports give the same decision."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trainflow.contracts.exceptions import exception_outcome


@dataclass(frozen=True)
class Report:
    """One rank's word to the round: its exception, the step it was in, the copies it holds."""

    rank: int
    type: str
    message: str
    step: int
    copies: list[int] = field(default_factory=list)
    t: float = 0.0
    blocked: str | None = None  # why this rank's process cannot go on (a save stuck in a collective)
    # a rank process's death (CRASHED, KILLED), reported by the process started in its place, which
    # cannot tell the step it died in (`step` -1); None: an exception, whose outcome its type tells
    outcome: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Report:
        return cls(**data)


@dataclass(frozen=True)
class RoundDecision:
    go: bool
    reason: str
    outcome: str = ""
    cause_rank: int = -1
    failed_step: int = 0
    restored_step: int = 0

    @classmethod
    def no_go(cls, reason: str) -> RoundDecision:
        return cls(go=False, reason=reason)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RoundDecision:
        return cls(**data)


def decide_round(
    causes: list[Report],
    first_symptom: Report | None,
    holding: dict[int, int],
    world_size: int,
    budget: dict[str, int],
    earlier: list[RoundDecision],
    blocked: str | None = None,
) -> RoundDecision:
    """`causes`: the reports whose error is not only a peer's going away; `first_symptom`: the first
    of the others; `holding`: step -> how many ranks hold a copy of it; `budget`: the recoveries each
    outcome had left at launch; `earlier`: this attempt's rounds; `blocked`: why a rank's process
    cannot go on, if one cannot."""
    # a process's death is never the symptom of another's exception, whichever was reported first
    deaths = [r for r in causes if r.outcome]
    cause = min(deaths or causes, key=lambda r: (r.t, r.rank)) if causes else first_symptom
    if cause is None:
        return RoundDecision.no_go("no rank reported what failed")
    outcome = cause.outcome or exception_outcome(cause.type).value
    failed_step = cause.step
    if failed_step < 0:  # a death: its peers were in the step it died in, or it died after its newest copy
        failed_step = first_symptom.step if first_symptom is not None else max(holding, default=0) + 1
    if cause.outcome:
        reason = f"rank {cause.rank} {cause.message} in step {failed_step}"
    else:
        reason = f"rank {cause.rank} raised {cause.type} at step {cause.step}: {cause.message}"
    if blocked:
        return RoundDecision.no_go(f"{blocked}: {reason}")
    if outcome not in budget:
        return RoundDecision.no_go(f"{outcome} is not retried: {reason}")
    left = budget[outcome] - sum(1 for d in earlier if d.outcome == outcome)
    if left <= 0:
        return RoundDecision.no_go(f"{outcome} has no retry left in its budget: {reason}")
    everyone = [step for step, ranks in holding.items() if ranks == world_size]
    if not everyone:
        held = ", ".join(f"step {step} by {ranks}" for step, ranks in sorted(holding.items())) or "none"
        return RoundDecision.no_go(f"no in-memory copy that all {world_size} ranks hold ({held}): {reason}")
    restored = max(everyone)
    if earlier:
        last = earlier[-1]
        if last.outcome == outcome and last.failed_step == failed_step and last.restored_step == restored:
            return RoundDecision.no_go(f"crash loop: {outcome} twice at step {failed_step}, stopping ({reason})")
    return RoundDecision(
        go=True,
        reason=reason,
        outcome=outcome,
        cause_rank=cause.rank,
        failed_step=failed_step,
        restored_step=restored,
    )
