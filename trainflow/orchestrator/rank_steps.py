"""Every rank's report of a step, joined into the step's one row of metrics.

Each rank reports every step it trains, with its own loss when its script logged one; rank 0 also
sends the step's other metrics. A node's relay sends the sum of its ranks' reports of a step
(StepSum). A step's loss is the mean over the ranks that logged one: ranks' own losses summed in
rank order, then the nodes' sums in the order they arrive. A step's
row is complete only once every rank of the world has reported that step, whatever order the
reports arrive in, so the mean never depends on how fast a rank's batch travelled. When the attempt
ends first (a rank died, or was stopped), its incomplete steps are recorded with the ranks that
did report, and the row says how many it used (`loss_ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainflow.contracts.status_protocol import StepEntry, StepSum

StepRow = tuple[int, float, dict[str, float]]  # step, time, metrics


@dataclass(frozen=True)
class StepReport:
    """One rank's report of one step."""

    rank: int
    step: int
    t: float
    loss: float | None = None  # this rank's loss, if its script logged one at this step
    metrics: dict[str, float] | None = None  # rank 0's metrics of the step (loss included)

    @classmethod
    def of_entry(cls, rank: int, entry: StepEntry, sent_at: float) -> StepReport:
        """A progress entry as the status channel accepted it: rank 0's metrics carry its loss, the
        other ranks send only theirs, beside the step."""
        t = entry.t if entry.t is not None else sent_at
        metrics = {k: v for k, v in entry.metrics.items() if v is not None} if entry.metrics and rank == 0 else None
        return cls(rank, entry.step, t, entry.rank_loss, metrics)


def mean_over_ranks(losses: dict[int, float]) -> float:
    """The mean of per-rank values, summed in rank order so every reader computes the same digits."""
    return sum(losses[rank] for rank in sorted(losses)) / len(losses)


@dataclass
class _Step:
    t: float
    ranks: set[int] = field(default_factory=set)
    losses: dict[int, float] = field(default_factory=dict)
    metrics: dict[str, float] | None = None
    summed: int = 0  # ranks counted in the nodes' sums below
    loss_sum: float = 0.0
    loss_count: int = 0


class StepsOverRanks:
    def __init__(self, world_size: int):
        self.world_size = world_size
        self._open: dict[int, _Step] = {}

    def add(self, report: StepReport | StepSum) -> list[StepRow]:
        """One rank's report, or a node's sum; returns the rows of the steps it completed."""
        step = self._open.setdefault(report.step, _Step(report.t))
        if isinstance(report, StepSum):
            step.summed += report.ranks
            step.loss_sum += report.loss_sum
            step.loss_count += report.loss_count
            if report.metrics is not None:
                step.metrics, step.t = {k: v for k, v in report.metrics.items() if v is not None}, report.t
        else:
            step.ranks.add(report.rank)
            if report.loss is not None:
                step.losses[report.rank] = report.loss
            if report.rank == 0:
                step.metrics, step.t = dict(report.metrics or {}), report.t
        if len(step.ranks) + step.summed < self.world_size:
            return []
        del self._open[report.step]
        return [row for row in [_row(report.step, step, partial=False)] if row is not None]

    def close(self) -> list[StepRow]:
        """The rows of the steps not every rank reported, with what was reported (the attempt ended)."""
        steps, self._open = self._open, {}
        rows = (_row(number, step, partial=True) for number, step in sorted(steps.items()))
        return [row for row in rows if row is not None]


def _row(number: int, step: _Step, partial: bool) -> StepRow | None:
    metrics = dict(step.metrics or {})
    metrics.pop("loss", None)
    count = len(step.losses) + step.loss_count
    if count:
        own = sum(step.losses[rank] for rank in sorted(step.losses))
        metrics["loss"] = mean_over_ranks(step.losses) if not step.loss_count else (own + step.loss_sum) / count
        if partial:
            metrics["loss_ranks"] = float(count)
    return (number, step.t, metrics) if metrics else None
