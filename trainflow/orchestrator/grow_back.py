"""Growing a shrunken job back to its size.

A lost node that could not be replaced left the job on fewer nodes (`resources.min_nodes`). While
an attempt runs that way, each checkpoint it commits is a moment to ask the backend again whether
the left-out slots can come back (a replacement node, the lost one healed). Once they can, the
attempt is stopped as a preemption stops it: every rank agrees at its next control point, saves an
emergency checkpoint and leaves, so no step is lost. That attempt ends RESIZED, a branch that
spends no retry budget, and the next one runs on the full node count, resharding from the
checkpoint as the shrink did.

Asked at most once per `every_s`, never at the last step (the run is done then), and stopped at most
once per attempt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from trainflow.contracts.attempt import AttemptResult
from trainflow.contracts.outcome import Outcome

ASK_EVERY_S = 5.0


@dataclass
class GrowBack:
    """The way back for one shrunken attempt: which slots it runs without, and what it takes to
    ask for them (`available`) and to stop the attempt (`stop`)."""

    slots: list[int]
    nodes: int  # the attempt's nodes now
    final_step: int
    available: Callable[[int], bool]  # the backend: can this slot come back for the next attempt?
    stop: Callable[[], None]  # the SIGTERM of a preemption, to the running attempt
    every_s: float = ASK_EVERY_S
    clock: Callable[[], float] = time.monotonic
    requested: str | None = None  # why the attempt was stopped, once it was
    unanswered: str | None = None  # the backend's last failure to answer, if any
    _asked_at: float | None = field(default=None, repr=False)

    def at_commit(self, step: int) -> bool:
        """A checkpoint of `step` is committed: ask for the slots, and stop the attempt once every one
        is back. True when this call stopped it."""
        if self.requested is not None or step >= self.final_step:
            return False
        now = self.clock()
        if self._asked_at is not None and now - self._asked_at < self.every_s:
            return False
        self._asked_at = now
        # every slot is asked (a backend brings a slot back when asked): a partial return is kept for later
        try:
            back = [slot for slot in self.slots if self.available(slot)]
        except Exception as exc:  # noqa: BLE001 - a backend that cannot answer now leaves the job as it runs
            self.unanswered = f"{type(exc).__name__}: {exc}"
            return False
        if len(back) < len(self.slots):
            return False
        self.requested = (
            f"node slot(s) {', '.join(str(s) for s in self.slots)} available again after the checkpoint at "
            f"step {step}: stopped to grow back from {self.nodes} to {self.nodes + len(self.slots)} node(s)"
        )
        self.stop()
        return True

    def resized(self, result: AttemptResult) -> AttemptResult:
        """The attempt's result as it ended: a preemption this stop caused is RESIZED; any other end
        (a failure first, or the run finishing) stands."""
        if self.requested is None or result.outcome != Outcome.PREEMPTED:
            return result
        return replace(result, outcome=Outcome.RESIZED, reason=f"{self.requested}; {result.reason}")
