"""trainflow.failures: classifying an ended attempt and deciding whether to retry."""

from __future__ import annotations

import pytest

from trainflow.backends.base import NodeExit
from trainflow.failures import AttemptResult, Outcome, classify_exit, decide
from trainflow.runtime.reporter import EXIT_ORCHESTRATOR_LOST
from trainflow.spec import FaultTolerance
from trainflow.status import AttemptStatus


def policy(max_restarts: int = 3, **overrides) -> FaultTolerance:
    return FaultTolerance(max_restarts=max_restarts, **overrides)


def result(attempt: int, outcome: Outcome, last_step: int = 10, reason: str = "why") -> AttemptResult:
    return AttemptResult(
        attempt=attempt,
        outcome=outcome,
        reason=reason,
        world_size=2,
        started_at=0.0,
        ended_at=1.0,
        detected_at=1.0,
        failed_at=None,
        last_step=last_step,
        resumed_from_step=0,
    )


# --- decide ----------------------------------------------------------------------------------------


def test_success_is_not_retried():
    decision = decide(policy(3), [result(1, Outcome.SUCCEEDED, reason="finished at step 100")])
    assert decision.retry is False
    assert decision.reason == "finished at step 100"


@pytest.mark.parametrize("outcome", [Outcome.USER_ERROR, Outcome.CANCELLED])
def test_non_retryable_outcomes_stop(outcome):
    decision = decide(policy(3), [result(1, outcome)])
    assert decision.retry is False
    assert "not retried" in decision.reason


@pytest.mark.parametrize(
    "outcome", [Outcome.CRASHED, Outcome.KILLED, Outcome.HUNG, Outcome.NODE_LOST, Outcome.DIVERGED]
)
def test_retryable_outcome_with_budget_is_retried(outcome):
    decision = decide(policy(3), [result(1, outcome)])
    assert decision.retry is True
    assert "restart retry 1 of 3" in decision.reason


def test_preemptions_and_infra_failures_have_their_own_budgets():
    assert "preemption retry 1 of 10" in decide(policy(0), [result(1, Outcome.PREEMPTED)]).reason
    assert decide(policy(0, max_infra_failures=1), [result(1, Outcome.INFRA)]).retry is True
    spent = decide(policy(5, max_infra_failures=1), [result(1, Outcome.INFRA, 5), result(2, Outcome.INFRA, 9)])
    assert spent.retry is False and "infrastructure budget spent" in spent.reason


def test_user_errors_are_retried_only_when_asked():
    assert decide(policy(3), [result(1, Outcome.USER_ERROR)]).retry is False
    retry_all = policy(3, max_user_errors=1, retry_on=["USER_ERROR", "CRASHED"])
    assert decide(retry_all, [result(1, Outcome.USER_ERROR)]).retry is True


def test_outcome_left_out_of_retry_on_is_not_retried():
    decision = decide(policy(3, retry_on=["CRASHED"]), [result(1, Outcome.HUNG)])
    assert decision.retry is False and "HUNG is not retried" in decision.reason


def test_backoff_doubles_and_skips_preemptions():
    rules = policy(5, backoff_s=2.0, backoff_max_s=3.0)
    assert decide(rules, [result(1, Outcome.CRASHED, 1)]).backoff_s == 0.0  # an isolated failure: at once
    assert decide(rules, [result(1, Outcome.CRASHED, 1), result(2, Outcome.HUNG, 2)]).backoff_s == 2.0
    three = [result(1, Outcome.CRASHED, 1), result(2, Outcome.HUNG, 2), result(3, Outcome.KILLED, 3)]
    assert decide(rules, three).backoff_s == 3.0  # capped
    assert decide(rules, [result(1, Outcome.PREEMPTED)]).backoff_s == 0.0


def test_repeated_preemption_at_one_step_is_not_a_crash_loop():
    results = [result(1, Outcome.PREEMPTED, 40), result(2, Outcome.PREEMPTED, 40)]
    assert decide(policy(0), results).retry is True


def test_budget_spent_stops():
    results = [result(1, Outcome.CRASHED, 10), result(2, Outcome.CRASHED, 20), result(3, Outcome.CRASHED, 30)]
    decision = decide(policy(2), results)
    assert decision.retry is False
    assert "budget" in decision.reason


def test_last_restart_within_budget_is_taken():
    results = [result(1, Outcome.CRASHED, 10), result(2, Outcome.CRASHED, 20)]
    decision = decide(policy(2), results)
    assert decision.retry is True and "restart retry 2 of 2" in decision.reason


def test_no_restarts_allowed():
    decision = decide(policy(0), [result(1, Outcome.CRASHED)])
    assert decision.retry is False and "budget" in decision.reason


def test_crash_loop_stops_even_with_budget():
    results = [result(1, Outcome.CRASHED, 40), result(2, Outcome.CRASHED, 40)]
    decision = decide(policy(10), results)
    assert decision.retry is False
    assert "crash loop" in decision.reason


def test_same_step_but_different_outcome_is_not_a_crash_loop():
    results = [result(1, Outcome.NODE_LOST, 40), result(2, Outcome.CRASHED, 40)]
    assert decide(policy(10), results).retry is True


def test_same_outcome_with_progress_is_not_a_crash_loop():
    results = [result(1, Outcome.CRASHED, 40), result(2, Outcome.CRASHED, 60)]
    assert decide(policy(10), results).retry is True


# --- classify_exit ----------------------------------------------------------------------------------


def status(finished: dict | None = None, errors: list[dict] | None = None) -> AttemptStatus:
    return AttemptStatus(attempt=1, finished=finished, errors=errors or [])


def test_all_zero_and_finished_is_success():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, 0)], status(finished={"step": 200}))
    assert outcome == Outcome.SUCCEEDED
    assert "200" in reason


def test_all_zero_without_finish_is_a_user_error():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, 0)], status())
    assert outcome == Outcome.USER_ERROR
    assert "finish" in reason


def test_user_exception_names_the_rank():
    error = {"rank": 3, "type": "ValueError", "step": 17, "message": "bad shape"}
    outcome, reason = classify_exit([NodeExit(0, 1), NodeExit(1, 0)], status(errors=[error]))
    assert outcome == Outcome.USER_ERROR
    assert "rank 3" in reason and "ValueError" in reason and "bad shape" in reason


def test_storage_error_is_infra():
    error = {"rank": 0, "type": "StorageError", "step": 5, "message": "s3 down"}
    outcome, _ = classify_exit([NodeExit(0, 1)], status(errors=[error]))
    assert outcome == Outcome.INFRA


def test_killed_by_signal():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, -9)], status())
    assert outcome == Outcome.KILLED
    assert "SIGKILL" in reason and "node 1" in reason


def test_orchestrator_lost_is_infra():
    outcome, reason = classify_exit([NodeExit(0, EXIT_ORCHESTRATOR_LOST)], status())
    assert EXIT_ORCHESTRATOR_LOST == 75
    assert outcome == Outcome.INFRA
    assert "orchestrator" in reason


def test_plain_nonzero_exit_is_a_crash():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, 2)], status())
    assert outcome == Outcome.CRASHED
    assert "node 1" in reason and "code 2" in reason


def test_running_nodes_do_not_count_as_failed():
    outcome, _ = classify_exit([NodeExit(0, None), NodeExit(1, 0)], status(finished={"step": 5}))
    assert outcome == Outcome.SUCCEEDED


def test_other_signals_are_crashes_naming_the_signal():
    outcome, reason = classify_exit([NodeExit(0, -35)], status())
    assert outcome == Outcome.CRASHED and "signal 35" in reason
    outcome, reason = classify_exit([NodeExit(0, -11)], status())
    assert outcome == Outcome.CRASHED and "SIGSEGV" in reason


def test_the_failed_workers_own_code_wins_over_its_agents():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, 1, worker_returncode=-9)], status())
    assert outcome == Outcome.KILLED and "SIGKILL" in reason


def test_root_cause_exitcode_is_read_from_torchruns_failure_report(tmp_path):
    from trainflow.backends.local import root_cause_exitcode

    log = tmp_path / "node-1.log"
    log.write_text(
        "Failures:\n  <NO_OTHER_FAILURES>\nRoot Cause (first observed failure):\n[0]:\n"
        "  rank      : 1 (local_rank: 0)\n  exitcode  : -9 (pid: 4242)\n  traceback : Signal 9 (SIGKILL)\n"
    )
    assert root_cause_exitcode(log) == -9
    assert root_cause_exitcode(tmp_path / "missing.log") is None


def test_every_failure_kind_the_policy_names_is_an_outcome():
    from trainflow.spec import FailureKind

    assert {k.value for k in FailureKind} <= {o.value for o in Outcome}
