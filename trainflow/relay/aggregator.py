"""A node's ranks folded into one stream: what the relay sends the orchestrator for them.

Fed each rank's messages as they arrive (`apply`), it keeps per rank its last line's time, its
step watermark and the compute times since the last report, and per step the number of this node's
ranks that reported it with the sum of their losses (and rank 0's metrics); every other message
(start, restore, checkpoint, error, finish...) goes on verbatim. `report()` takes what is due: the
marks of ranks that changed (of every rank, once a heartbeat interval has passed), the step sums,
the events. No I/O: the relay and the scale bench drive it alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainflow.contracts.status_protocol import (
    Heartbeat,
    NodeReport,
    Progress,
    RankEvent,
    RankMark,
    Replaced,
    Resources,
    Restored,
    StepSum,
)


@dataclass
class _Rank:
    pid: int | None
    seen_at: float
    step: int = 0
    progressed_at: float | None = None
    step_time_s: float | None = None
    compute_n: int = 0
    compute_sum_s: float = 0.0
    changed: bool = True


@dataclass
class _Sum:
    t: float
    ranks: int = 0
    losses: dict[int, float] = field(default_factory=dict)
    metrics: dict | None = None

    def loss_sum(self) -> float:
        return sum(self.losses[rank] for rank in sorted(self.losses))  # the same digits whatever the arrival order


class NodeAggregator:
    def __init__(self, node: int, heartbeat_interval_s: float):
        self.node = node
        self.heartbeat_interval_s = heartbeat_interval_s
        self._ranks: dict[int, _Rank] = {}
        self._sums: dict[int, _Sum] = {}
        self._events: list[RankEvent] = []
        self._closed: list[int] = []
        self._everyone_due_at = 0.0
        self.step_complete = False  # every rank of the node reported a step since the last report

    def __len__(self) -> int:
        return len(self._ranks)

    def apply(self, rank: int, pid: int | None, message: object, now: float) -> None:
        """One message of a rank, read at `now` (the relay's clock)."""
        state = self._ranks.get(rank)
        if state is None:
            state = self._ranks[rank] = _Rank(pid, now)
        state.seen_at = now
        match message:
            case Heartbeat():
                return
            case Progress(steps=steps):
                for entry in steps:
                    state.step = entry.step
                    state.step_time_s = entry.step_time_s
                    if entry.compute_s is not None:
                        state.compute_n += 1
                        state.compute_sum_s += entry.compute_s
                    self._add_step(rank, entry, message.t)
                state.progressed_at = now
                state.changed = True
            case Restored(step=step):
                state.step = step
                state.changed = True
                self._events.append(RankEvent(rank=rank, pid=pid, message=message, t=now))
            case Resources():
                self._events.append(RankEvent(rank=rank, pid=pid, message=message, t=now))
            case Replaced():  # the rank's new process: its marks carry the new pid from now on
                state.pid = pid
                state.changed = True
                self._events.append(RankEvent(rank=rank, pid=pid, message=message, t=now))
            case _:
                self._events.append(RankEvent(rank=rank, pid=pid, message=message, t=now))

    def heard(self, rank: int, pid: int | None, now: float) -> None:
        """A rank's line that is no message of its own (its hello): it is alive."""
        self.apply(rank, pid, Heartbeat(t=now), now)

    def closed(self, rank: int) -> None:
        """The rank's connection ended, everything it sent applied."""
        self._closed.append(rank)

    def report(self, now: float, everyone: bool = False) -> tuple[NodeReport | None, list[RankEvent]]:
        """What is due now: the node report (None if nothing changed and no heartbeat is due) and
        the events, in order."""
        if now >= self._everyone_due_at:
            everyone = True
        if everyone:
            self._everyone_due_at = now + self.heartbeat_interval_s
        marks = []
        for rank, state in self._ranks.items():
            if not (everyone or state.changed):
                continue
            marks.append(
                RankMark(
                    rank=rank,
                    pid=state.pid,
                    seen_age_s=round(now - state.seen_at, 4),
                    step=state.step,
                    progressed_age_s=None if state.progressed_at is None else round(now - state.progressed_at, 4),
                    step_time_s=state.step_time_s,
                    compute_n=state.compute_n,
                    compute_sum_s=state.compute_sum_s,
                )
            )
            state.changed = False
            state.compute_n, state.compute_sum_s = 0, 0.0
        sums = [
            StepSum(step=step, t=s.t, ranks=s.ranks, loss_sum=s.loss_sum(), loss_count=len(s.losses), metrics=s.metrics)
            for step, s in sorted(self._sums.items())
        ]
        events, self._events, self._sums = self._events, [], {}
        self.step_complete = False
        closed, self._closed = self._closed, []
        if not (marks or sums or closed or everyone):
            return None, events
        return NodeReport(marks=marks, sums=sums, closed=closed, t=now), events

    def _add_step(self, rank: int, entry, sent_at: float) -> None:
        t = entry.t if entry.t is not None else sent_at
        step = self._sums.get(entry.step)
        if step is None:
            step = self._sums[entry.step] = _Sum(t)
        step.ranks += 1
        if step.ranks >= len(self._ranks):
            self.step_complete = True
        loss = entry.rank_loss
        if loss is not None:
            step.losses[rank] = loss
        if rank == 0:
            step.metrics, step.t = entry.metrics or {}, t
