"""Growing a shrunken job back: asked at each committed checkpoint, stopped once every left-out slot
is back, and that stop ends the attempt RESIZED, a branch that spends no retry budget."""

from __future__ import annotations

import pytest

from trainflow.backends.netns import LostSlots
from trainflow.contracts.summary import resizes_of
from trainflow.orchestrator.failures import AttemptResult, Outcome, decide
from trainflow.orchestrator.grow_back import GrowBack
from trainflow.runspec import FaultTolerance
from trainflow.runspec.fault_tolerance import DEFAULT_RETRY_ON


def result(attempt: int, outcome: Outcome, world_size: int = 4, last_step: int = 20, resumed: int = 0) -> AttemptResult:
    return AttemptResult(
        attempt=attempt,
        outcome=outcome,
        reason="why",
        world_size=world_size,
        started_at=0.0,
        ended_at=1.0,
        detected_at=1.0,
        failed_at=None,
        last_step=last_step,
        resumed_from_step=resumed,
    )


class Backend:
    """The two things growing back needs of a backend, as a record of what was asked."""

    def __init__(self, back: set[int]):
        self.back, self.asked, self.stops = back, [], 0

    def available(self, slot: int) -> bool:
        self.asked.append(slot)
        return slot in self.back

    def stop(self) -> None:
        self.stops += 1


def way_back(backend: Backend, slots=(1,), clock=lambda: 0.0, every_s: float = 5.0) -> GrowBack:
    return GrowBack(
        slots=list(slots),
        nodes=1,
        final_step=40,
        available=backend.available,
        stop=backend.stop,
        every_s=every_s,
        clock=clock,
    )


def test_the_attempt_is_stopped_once_at_the_first_commit_after_the_slot_is_back():
    backend = Backend(back=set())
    now = [0.0]
    grow = way_back(backend, clock=lambda: now[0], every_s=0.0)
    assert grow.at_commit(10) is False and backend.stops == 0 and grow.requested is None
    backend.back.add(1)
    assert grow.at_commit(20) is True and backend.stops == 1
    assert "after the checkpoint at step 20" in grow.requested and "from 1 to 2 node(s)" in grow.requested
    assert grow.at_commit(30) is False and backend.stops == 1  # never a second stop
    assert backend.asked == [1, 1]


def test_the_backend_is_asked_at_most_once_per_interval():
    backend = Backend(back=set())
    now = [100.0]
    grow = way_back(backend, clock=lambda: now[0], every_s=5.0)
    grow.at_commit(10)
    now[0] += 1.0
    backend.back.add(1)
    assert grow.at_commit(11) is False and backend.asked == [1]  # too soon to ask again
    now[0] += 5.0
    assert grow.at_commit(12) is True


def test_no_stop_at_the_last_step_or_while_any_slot_is_still_out():
    backend = Backend(back={1})
    assert way_back(backend).at_commit(40) is False and backend.asked == []  # the run is done there
    partial = Backend(back={1})
    grow = way_back(partial, slots=(1, 2))
    assert grow.at_commit(10) is False and partial.stops == 0
    assert partial.asked == [1, 2]  # every slot asked: a backend brings a slot back when asked


def test_only_the_preemption_the_stop_caused_becomes_resized():
    grow = way_back(Backend(back={1}))
    untouched = result(2, Outcome.PREEMPTED)
    assert grow.resized(untouched) is untouched  # nothing requested: a real preemption
    grow.at_commit(20)
    resized = grow.resized(result(2, Outcome.PREEMPTED))
    assert resized.outcome == Outcome.RESIZED and resized.reason.startswith("node slot(s) 1 available again")
    crashed = result(2, Outcome.CRASHED)
    assert grow.resized(crashed) is crashed  # a failure before the stop took effect stands


def test_a_resize_is_retried_without_budget_or_backoff():
    policy = FaultTolerance(max_restarts=0, max_preemptions=0, backoff_s=5.0)
    history = [result(1, Outcome.NODE_LOST), result(2, Outcome.RESIZED, world_size=2)]
    decision = decide(FaultTolerance(max_restarts=1, max_preemptions=0, backoff_s=5.0), history)
    assert decision.retry is True and decision.backoff_s == 0.0 and decision.reason.startswith("RESIZED")
    assert decide(policy, [result(1, Outcome.RESIZED)]).retry is True
    # a failure after it backs off as the first failure after one other, not after two
    later = [*history, result(3, Outcome.CRASHED, last_step=30)]
    assert decide(FaultTolerance(max_restarts=3, backoff_s=5.0), later).backoff_s == 5.0


def test_a_retry_policy_cannot_name_resized():
    assert Outcome.RESIZED not in DEFAULT_RETRY_ON
    with pytest.raises(ValueError, match="RESIZED"):
        FaultTolerance(retry_on=["RESIZED"])


def test_a_slot_replaced_later_fails_the_first_ask_and_returns_after():
    lost = LostSlots()
    lost.lose(1, replaced_later=True)
    lost.lose(2, replaced_later=False)
    assert lost.may_return(1) is False  # the job shrinks without it
    assert lost.may_return(1) is True and 1 in lost.replaced
    assert lost.may_return(2) is False and lost.may_return(2) is False  # permanent: never
    assert lost.may_return(0) is True  # never lost


def test_the_summary_records_each_resize():
    from trainflow.contracts.ledger import run_ledger

    results = [
        result(1, Outcome.NODE_LOST, world_size=4, last_step=15),
        result(2, Outcome.RESIZED, world_size=2, last_step=21, resumed=10),
        result(3, Outcome.SUCCEEDED, world_size=4, last_step=40, resumed=21),
    ]
    rows = [
        (r.attempt, r.from_world_size, r.to_world_size, r.after) for r in resizes_of(run_ledger(results, 4).attempts)
    ]
    assert rows == [(2, 4, 2, "NODE_LOST"), (3, 2, 4, "RESIZED")]


def test_a_backend_that_cannot_answer_leaves_the_attempt_running():
    def broken(slot: int) -> bool:
        raise RuntimeError("sinfo: unable to contact slurmctld")

    backend = Backend(back=set())
    grow = GrowBack(slots=[1], nodes=1, final_step=40, available=broken, stop=backend.stop, every_s=0.0)
    assert grow.at_commit(10) is False and backend.stops == 0
    assert grow.unanswered == "RuntimeError: sinfo: unable to contact slurmctld"
