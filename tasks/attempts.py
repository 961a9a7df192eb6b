"""release_attempt and classify_outcome: end an attempt completely, then choose the branch."""

from __future__ import annotations

from prefect import get_run_logger

from tasks import lifecycle_task
from tasks.records import Provisioned, RunRecord
from trainflow.backends import AttemptHandle
from trainflow.failures import AttemptResult, Decision, decide
from trainflow.spec import RunSpec


@lifecycle_task(name="release-attempt", task_run_name="release-attempt-{handle.attempt}")
def release_attempt(
    spec: RunSpec, record: RunRecord, provisioned: Provisioned, handle: AttemptHandle, result: AttemptResult
) -> int:
    """Stop whatever is left of the attempt and record it as a nested MLflow run."""
    stopped = provisioned.launcher.stop(handle, grace_s=spec.fault_tolerance.preemption_grace_s)
    tracker = provisioned.tracker
    child = tracker.start_run(
        record.experiment,
        run_name=f"{record.run_id}-attempt-{result.attempt}",
        tags={"trainflow.run_id": record.run_id, "attempt": str(result.attempt), "outcome": result.outcome.value},
        parent=record.mlflow_run_id,
    )
    tracker.log_params(
        child,
        {"attempt": result.attempt, "world_size": result.world_size, "resumed_from_step": result.resumed_from_step},
    )
    tracker.log_metrics(
        child,
        [
            (key, value, result.attempt, result.ended_at)
            for key, value in {
                "last_step": result.last_step,
                "duration_s": result.ended_at - result.started_at,
                "detection_latency_s": result.detection_latency_s,
            }.items()
            if value is not None
        ],
    )
    tracker.log_json(child, {"reason": result.reason, **result.evidence}, "evidence.json")
    tracker.end_run(child, "FINISHED" if result.outcome.value == "SUCCEEDED" else "FAILED")
    get_run_logger().info("attempt %d released (%d process(es) stopped)", result.attempt, stopped)
    return stopped


@lifecycle_task(name="classify-outcome")
def classify_outcome(spec: RunSpec, results: list[AttemptResult]) -> Decision:
    """Retry branch or finish: retryable outcome, budget left, and not a crash loop."""
    decision = decide(spec.fault_tolerance.max_restarts, results)
    get_run_logger().info("%s: %s", "retry" if decision.retry else "finish", decision.reason)
    return decision
