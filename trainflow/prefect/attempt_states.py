"""How an attempt's tasks end in Prefect: a failed attempt's watch task is Failed, with the outcome
and reason as its message, and its classify task is named after the branch taken; the flow run that
recovers goes on, since the flow reads these results without raising."""

from __future__ import annotations

from dataclasses import dataclass, fields

from prefect.futures import PrefectFuture
from prefect.states import Completed, Failed, State

from trainflow.contracts import AttemptResult, Outcome, RunSummary
from trainflow.orchestrator.failures import Decision

MESSAGE_REASON_CHARS = 500  # a state message is a line in the UI; the whole reason is in the logs and MLflow
RECOVERING, GAVE_UP = "Recovering", "Gave up"  # a classify task's state after a failed attempt
RESIZED, RESIZING = "Resized", "Resizing"  # an attempt the orchestrator stopped to change the job's size: no failure


def attempt_outcome(result: AttemptResult, steps_reported: bool = True) -> str:
    """'CRASHED at step 30: exit code 1 on rank 1' (no step for a script that reports none)."""
    at_step = f" at step {result.last_step}" if steps_reported else ""
    return f"{result.outcome.value}{at_step}: {result.reason[:MESSAGE_REASON_CHARS]}"


@dataclass(repr=False)
class FailedAttempt(AttemptResult):
    """A failed attempt's result: the same record, whose repr (in Prefect's log line for a failed
    task run) names the attempt instead of spelling out every field; the message says the rest."""

    def __repr__(self) -> str:
        return f"AttemptResult(attempt {self.attempt}: {self.outcome.value})"


def watched(result: AttemptResult, steps_reported: bool) -> AttemptResult | State:
    """What the watch task returns: the result itself for a success, a Completed state named Resized
    for a resize, else a Failed state holding it."""
    if result.outcome == Outcome.SUCCEEDED:
        return result
    if result.outcome == Outcome.RESIZED:
        return Completed(name=RESIZED, message=attempt_outcome(result, steps_reported), data=result)
    failed = FailedAttempt(**{f.name: getattr(result, f.name) for f in fields(result)})
    return Failed(message=attempt_outcome(result, steps_reported), data=failed)


def watched_result(watching: PrefectFuture) -> AttemptResult:
    """The attempt's result from its watch task, failed attempt or not; a watch that raised raises."""
    result = watching.result(raise_on_failure=False)
    if isinstance(result, BaseException):
        raise result
    return result


def decided(decision: Decision, result: AttemptResult) -> Decision | State:
    """What the classify task returns: the decision, in a state named after the branch when the attempt failed."""
    if result.outcome == Outcome.SUCCEEDED:
        return decision
    name = RESIZING if result.outcome == Outcome.RESIZED else RECOVERING if decision.retry else GAVE_UP
    return Completed(name=name, message=f"{attempt_outcome(result)}; {decision.reason}", data=decision)


def failed_attempts(summary: RunSummary | dict) -> str:
    """'; 1 of 2 attempts failed: CRASHED at step 30 (...)' for the flow run's final message, or nothing."""
    s = summary if isinstance(summary, RunSummary) else RunSummary.model_validate(summary)
    failed = [row for row in s.attempts if row.outcome not in (Outcome.SUCCEEDED, Outcome.RESIZED)]
    if not failed:
        return ""
    at = (lambda row: f" at step {row.last_step}") if s.steps_reported else (lambda row: "")
    causes = "; ".join(f"attempt {row.attempt} {row.outcome.value}{at(row)} ({row.reason[:200]})" for row in failed)
    return f"; {len(failed)} of {len(s.attempts)} attempt{'s' if len(s.attempts) > 1 else ''} failed: {causes}"
