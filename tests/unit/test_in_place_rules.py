"""In-process restart's rules: the round's decision on the ranks' reports (runtime/in_place_rules.py),
the budgets the orchestrator hands down and counts again (orchestrator/failures.py), and the figures
of a recovery in place in the run's ledger."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from trainflow.contracts import AttemptResult, Outcome, run_ledger
from trainflow.contracts.in_place import InPlaceRestart
from trainflow.orchestrator.failures import decide, in_place_budget
from trainflow.runspec import FaultTolerance
from trainflow.runtime.in_place import Stopped, wait_for
from trainflow.runtime.in_place_rules import Report, RoundDecision, decide_round

PEER_GONE = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20623"


def report(rank: int, type_: str = "RuntimeError", message: str = PEER_GONE, step: int = 13, **kw) -> Report:
    return Report(rank=rank, type=type_, message=message, step=step, copies=kw.pop("copies", [11, 12]), **kw)


CAUSE = report(1, "DistNetworkError", "link down", 12, copies=[10, 11], t=1.5)
SYMPTOM = report(0, t=2.0)
# rank 1 raised after step 12's update; its two peers were in step 13's all-reduce
HOLDING = {11: 3, 12: 2}


def round_decision(causes=(CAUSE,), symptom=SYMPTOM, holding=None, budget=None, earlier=()) -> RoundDecision:
    return decide_round(
        list(causes), symptom, HOLDING if holding is None else holding, 3, budget or {"INFRA": 3}, list(earlier)
    )


def test_the_cause_is_the_earliest_rank_whose_error_is_not_a_peers_going_away():
    later = report(2, "DistStoreError", "store gone", 13, t=1.8)
    assert round_decision(causes=(later, CAUSE)) == RoundDecision(
        go=True,
        reason="rank 1 raised DistNetworkError at step 12: link down",
        outcome="INFRA",
        cause_rank=1,
        failed_step=12,
        restored_step=11,  # the newest step every rank holds
    )


DEATH = Report(
    rank=1,
    type="SIGSEGV",
    message="was killed by SIGSEGV (process 77)",
    step=-1,
    copies=[10, 11],
    t=1.9,
    outcome="CRASHED",
)


def test_a_rank_process_that_died_is_the_cause_even_after_a_peers_error_and_its_step_is_its_peers():
    # the replacement reports the death when it starts, after a peer raised something that is not
    # only a peer's going away: a death is never the symptom of another's exception
    early = report(2, "DistStoreError", "store gone", 13, t=1.2)
    decision = round_decision(causes=(early, DEATH), budget={"INFRA": 3, "CRASHED": 3})
    assert decision == RoundDecision(
        go=True,
        reason="rank 1 was killed by SIGSEGV (process 77) in step 13",
        outcome="CRASHED",
        cause_rank=1,
        failed_step=13,  # the step its peers were in
        restored_step=11,
    )
    assert round_decision(causes=(DEATH,), symptom=None, budget={"CRASHED": 1}).failed_step == 13  # newest held + 1
    assert not round_decision(causes=(DEATH,), budget={"INFRA": 3}).go  # CRASHED not retried


def test_an_outcome_the_spec_does_not_retry_or_whose_budget_is_spent_ends_the_attempt():
    user = report(1, "ValueError", "bad batch", 12, t=1.0)
    not_retried = round_decision(causes=(user,))
    assert not_retried.reason == "USER_ERROR is not retried: rank 1 raised ValueError at step 12: bad batch"
    spent = round_decision(budget={"INFRA": 1}, earlier=[RoundDecision(True, "earlier", "INFRA", 1, 5, 4)])
    assert not spent.go and spent.reason.startswith("INFRA has no retry left in its budget")
    assert round_decision(budget={"INFRA": 0}).go is False


def test_the_same_failure_at_the_same_step_from_the_same_copy_twice_is_a_crash_loop():
    again = round_decision(earlier=[round_decision()])
    assert not again.go and again.reason.startswith("crash loop: INFRA twice at step 12")


def test_without_a_copy_every_rank_holds_the_attempt_ends():
    apart = round_decision(holding={14: 1, 15: 1})
    assert apart.reason.startswith("no in-memory copy that all 3 ranks hold (step 14 by 1, step 15 by 1)")
    assert round_decision(holding={}).reason.startswith("no in-memory copy that all 3 ranks hold (none)")


def test_only_symptoms_name_the_first_as_the_cause_and_nothing_reported_is_no_go():
    decision = round_decision(causes=(), symptom=report(2, t=1.0), budget={"USER_ERROR": 1})
    assert (decision.go, decision.cause_rank, decision.outcome) == (True, 2, "USER_ERROR")
    assert round_decision(causes=(), symptom=None).reason == "no rank reported what failed"


def result(outcome: Outcome, in_place: list[InPlaceRestart] | None = None) -> AttemptResult:
    return AttemptResult(
        attempt=1,
        outcome=outcome,
        reason="why",
        world_size=4,
        started_at=0.0,
        ended_at=100.0,
        detected_at=100.0,
        failed_at=None,
        last_step=30,
        resumed_from_step=0,
        totals={"steps": 32, "step_time_s": 32.0},
        in_place=in_place or [],
    )


RESTART = InPlaceRestart(
    round=1,
    outcome=Outcome.INFRA,
    reason="rank 1 raised DistNetworkError at step 12: link down",
    cause_rank=1,
    failed_step=12,
    restored_step=9,
    failed_at=40.0,
    resumed_at=40.5,
    ranks_kept=4,
)


def test_the_budget_handed_down_is_what_the_retries_and_the_recoveries_in_place_left():
    policy = FaultTolerance(in_process_restart=True, max_infra_failures=2)
    # USER_ERROR is not in the default retry_on; a rank's death (CRASHED, KILLED, HUNG) spends max_restarts
    assert in_place_budget(policy, []) == {"INFRA": 2, "CRASHED": 3, "KILLED": 3, "HUNG": 3}
    deaths = {"CRASHED": 3, "KILLED": 3, "HUNG": 3}
    assert in_place_budget(policy, [result(Outcome.INFRA, [RESTART])]) == {"INFRA": 0, **deaths}
    users = FaultTolerance(in_process_restart=True, max_user_errors=1, retry_on=[Outcome.USER_ERROR])
    assert in_place_budget(users, []) == {"USER_ERROR": 1}
    assert in_place_budget(FaultTolerance(), []) == {}
    # an attempt that recovered in place once and then failed again has spent two retries
    assert decide(policy, [result(Outcome.INFRA, [RESTART])]).retry is True
    spent = decide(policy, [result(Outcome.INFRA, [RESTART, replace(RESTART, round=2)])])
    assert not spent.retry and spent.reason.startswith("infrastructure budget spent (2)")


def test_the_ledger_counts_a_recovery_in_place_as_lost_work_and_recovery():
    ledger = run_ledger([result(Outcome.SUCCEEDED, [RESTART])], world_size=4)
    (row,) = ledger.attempts
    assert row.lost_steps == 2  # steps 10 and 11 were trained again; the failed step 12 is not counted
    assert row.in_place[0]["recovery_s"] == 0.5 and row.in_place[0]["ranks_kept"] == 4
    assert ledger.figures.recovery_s_total == 0.5
    assert ledger.figures.lost_steps == 2


def test_a_wait_in_the_round_ends_when_the_key_is_set_when_stopped_or_past_its_time():
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    store.set("ready", "1")
    wait_for(store, ["ready"], 30.0, stopped=lambda: False)  # returns at once
    polls = []

    def stopped() -> bool:  # a SIGTERM's flag, seen after the third slice
        polls.append(1)
        return len(polls) >= 3

    with pytest.raises(Stopped):
        wait_for(store, ["never"], 30.0, stopped)
    assert len(polls) == 3
    with pytest.raises(RuntimeError):  # the store's own timeout error, once the time is up
        wait_for(store, ["never"], 0.3, stopped=lambda: False)


def test_a_rank_whose_process_cannot_go_on_makes_the_round_no_go():
    blocked = decide_round([CAUSE], SYMPTOM, HOLDING, 3, {"INFRA": 3}, [], "rank 0's checkpoint save did not end")
    assert not blocked.go and blocked.reason.startswith("rank 0's checkpoint save did not end: rank 1 raised")
