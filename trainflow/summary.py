"""The run summary: the JSON contract of `trainflow run --json`, computed from the attempts."""

from __future__ import annotations

from trainflow.failures import AttemptResult, Outcome


def attempt_rows(results: list[AttemptResult]) -> list[dict]:
    """Per attempt: outcome, timing, detection latency, recovery time and steps lost."""
    rows = []
    for index, result in enumerate(results):
        following = results[index + 1] if index + 1 < len(results) else None
        previous = results[index - 1] if index > 0 else None
        recovery = None
        if previous is not None and result.first_step_at is not None:
            recovery = round(result.first_step_at - previous.detected_at, 3)
        lost = max(0, result.last_step - following.resumed_from_step) if following else 0
        latency = result.detection_latency_s
        rows.append(
            {
                "attempt": result.attempt,
                "outcome": result.outcome.value,
                "reason": result.reason,
                "world_size": result.world_size,
                "resumed_from_step": result.resumed_from_step,
                "last_step": result.last_step,
                "started_at": result.started_at,
                "ended_at": result.ended_at,
                "detected_at": None if result.outcome == Outcome.SUCCEEDED else result.detected_at,
                "detection_latency_s": None if latency is None else round(latency, 3),
                "recovery_s": recovery,
                "lost_steps": lost,
            }
        )
    return rows


def goodput(results: list[AttemptResult]) -> float | None:
    """Time spent on steps that count toward the final model, over the wall time of all attempts."""
    if not results:
        return None
    executed = sum(max(0, r.last_step - r.resumed_from_step) for r in results)
    step_time = sum(r.step_time_total_s for r in results)
    useful = results[-1].last_step - results[0].resumed_from_step
    wall = results[-1].ended_at - results[0].started_at
    if executed <= 0 or wall <= 0:
        return 0.0
    return round(min(1.0, useful * (step_time / executed) / wall), 4)


def run_status(results: list[AttemptResult]) -> str:
    return "succeeded" if results and results[-1].outcome == Outcome.SUCCEEDED else "failed"
