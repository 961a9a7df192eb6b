"""A failed attempt is visibly failed in Prefect, and the flow run's message says which failed and why."""

from __future__ import annotations

from tests.unit.test_ledger import summary_of
from trainflow.contracts import AttemptResult, Outcome
from trainflow.orchestrator.failures import Decision
from trainflow.prefect.attempt_states import decided, failed_attempts, watched


def attempt(number: int, outcome: Outcome, last_step: int, reason: str, resumed: int = 0) -> AttemptResult:
    return AttemptResult(
        attempt=number,
        outcome=outcome,
        reason=reason,
        world_size=2,
        resumed_from_step=resumed,
        last_step=last_step,
        started_at=100.0 * number,
        ended_at=100.0 * number + 10,
        detected_at=100.0 * number + 10,
        failed_at=None,
    )


def test_a_failed_attempt_is_a_failed_state_with_its_outcome_and_reason():
    crashed = attempt(1, Outcome.CRASHED, 30, "rank 1 exited with code 3")
    state = watched(crashed, steps_reported=True)
    assert state.is_failed() and state.message == "CRASHED at step 30: rank 1 exited with code 3"
    assert vars(state.data) == vars(crashed) and repr(state.data) == "AttemptResult(attempt 1: CRASHED)"
    assert watched(attempt(2, Outcome.SUCCEEDED, 60, "finished"), True).outcome == Outcome.SUCCEEDED
    assert watched(crashed, steps_reported=False).message == "CRASHED: rank 1 exited with code 3"


def test_classify_names_the_branch_after_a_failed_attempt():
    crashed = attempt(1, Outcome.CRASHED, 30, "exit 3")
    retry = decided(Decision(True, "CRASHED is retryable: restart 1 of 3"), crashed)
    assert retry.name == "Recovering" and retry.is_completed()
    assert retry.message == "CRASHED at step 30: exit 3; CRASHED is retryable: restart 1 of 3"
    assert decided(Decision(False, "budget spent"), crashed).name == "Gave up"
    done = Decision(False, "finished")
    assert decided(done, attempt(2, Outcome.SUCCEEDED, 60, "")) is done


def test_the_flow_message_counts_the_failed_attempts():
    crashed = attempt(1, Outcome.CRASHED, 30, "rank 1 exited with code 3")
    summary = summary_of([crashed, attempt(2, Outcome.SUCCEEDED, 60, "finished", resumed=20)])
    assert (
        failed_attempts(summary) == "; 1 of 2 attempts failed: attempt 1 CRASHED at step 30 (rank 1 exited with code 3)"
    )
    assert failed_attempts(summary.as_json_dict()) == failed_attempts(summary)
    assert failed_attempts(summary_of([attempt(1, Outcome.SUCCEEDED, 60, "finished")])) == ""


def test_a_resized_attempt_is_no_failure_in_prefect_or_in_the_flow_message():
    resized = attempt(2, Outcome.RESIZED, 21, "node slot(s) 1 available again", resumed=10)
    state = watched(resized, steps_reported=True)
    assert state.is_completed() and state.name == "Resized" and state.data is resized
    branch = decided(Decision(True, "RESIZED: node slot(s) 1 available again"), resized)
    assert branch.name == "Resizing" and branch.is_completed()
    lost = attempt(1, Outcome.NODE_LOST, 15, "node 1 silent")
    summary = summary_of([lost, resized, attempt(3, Outcome.SUCCEEDED, 60, "finished", resumed=21)])
    assert failed_attempts(summary) == "; 1 of 3 attempts failed: attempt 1 NODE_LOST at step 15 (node 1 silent)"
