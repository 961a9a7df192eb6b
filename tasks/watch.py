"""watch_attempt: follow one attempt until it ends, recording metrics and passing on commits."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.states import State

from tasks import lifecycle_task
from tasks.attempt_states import watched
from tasks.attempts import STOP_GRACE_S
from tasks.output_tail import sampled_output
from tasks.records import Launched
from tasks.reporting import report_progress
from trainflow.orchestrator import live, progress
from trainflow.orchestrator.failures import AttemptResult
from trainflow.orchestrator.watcher import AttemptWatcher, WatchLimits


@lifecycle_task(name="watch-attempt", task_run_name="watch-attempt-{launched.handle.attempt}")
def watch_attempt(launched: Launched) -> AttemptResult | State:
    """Watch exits, heartbeats and progress until the attempt ends; each commit goes to the attempt's
    commit feed (trainflow.orchestrator.live), which the flow snapshots from until watching is over."""
    logger = get_run_logger()
    spec, record, provisioned, handle = launched.spec, launched.record, launched.provisioned, launched.handle

    def on_event(event: dict) -> None:
        kind = event["kind"]
        if kind == "checkpoint":
            live.publish_commit(record.run_id, handle.attempt, event)
        elif kind == "error":
            logger.error("rank %s: %s: %s", event.get("rank"), event.get("type"), event.get("message"))
        elif kind == "restored":
            logger.info("rank %s restored step %s (%s) in %.2fs%s", event.get("rank"), event["step"], event.get("tier"),
                        event["seconds"], f"; passed over: {event['fallbacks']}" if event.get("fallbacks") else "")
            if event.get("rank") == 0:
                for skipped in event.get("fallbacks", []):  # which checkpoint was passed over, and why
                    logger.warning("checkpoint skipped at restore: %s", skipped)
        elif kind == "straggler":
            logger.warning("rank %s on node %s is a straggler (compute %.1fx the others') at step %s",
                           event["rank"], event["node"], event["score"], event["step"])
        elif kind == "layout":
            logger.info("attempt %d layout: %s, world size %s, dp %s, tp %s, pp %s", handle.attempt,
                        event.get("strategy"), event.get("world_size"), event.get("dp_degree"),
                        event.get("tp_degree"), event.get("pp_degree"))
            for warning in event.get("warnings", []):
                logger.warning("layout: %s", warning)
            if event.get("warnings"):
                provisioned.tracker.set_tags(record.mlflow_run_id, {"layout_warnings": " | ".join(event["warnings"])})
        elif kind == "preempted" and event.get("signalled"):
            logger.warning("rank %s was preempted: emergency checkpoint at step %s", event["rank"], event["step"])

    def on_metrics(rows: list) -> None:
        steps = [(step, value) for key, value, step, _ in rows if key == "loss"]
        if steps:
            progress.publish(steps[-1][0], spec.workload.steps, handle.attempt, steps[-1][1])
        provisioned.tracker.log_metrics(record.mlflow_run_id, rows)
        provisioned.tracker.log_metrics(launched.attempt_run_id, rows)  # the attempt's own series, on its run
        report_progress(record, handle.attempt, rows)  # the UI's progress artifact, rate-limited

    watcher = AttemptWatcher(
        launcher=provisioned.launcher,
        handle=handle,
        channel=provisioned.channel,
        limits=WatchLimits(
            heartbeat_timeout_s=spec.fault_tolerance.heartbeat_timeout_s,
            hang_timeout_s=spec.fault_tolerance.hang_timeout_s,
            straggler_factor=spec.fault_tolerance.straggler_factor,
            straggler_steps=spec.fault_tolerance.straggler_steps,
            startup_timeout_s=spec.fault_tolerance.startup_timeout_s,
            exit_timeout_s=spec.fault_tolerance.exit_timeout_s,
        ),
        world_size=spec.world_size,
        resumed_from_step=launched.resumed_from_step,
        on_metrics=on_metrics,
        on_event=on_event,
        step_metrics_every_s=spec.tracking.step_metrics_every_s,
        mean_metrics=tuple(spec.tracking.mean_metrics),
        final_step=spec.workload.steps,
        plain=spec.workload.mode.value == "plain",
    )
    try:
        with sampled_output(handle, logger):  # a bounded tail of the training output, while it trains
            result = watcher.run()
        if result.evidence.get("storage_calls"):
            # a storage outage: the flow may be waiting on the same store to snapshot a commit, and
            # until it releases the attempt the workers would train on past the verdict once it answers
            provisioned.launcher.stop(handle, grace_s=STOP_GRACE_S)
    finally:
        live.end_commits(record.run_id, handle.attempt)
    log = logger.info if result.outcome.value == "SUCCEEDED" else logger.warning
    at_step = "" if watcher.plain else f" at step {result.last_step}"  # a plain script reports no steps
    log("attempt %d ended %s%s: %s", result.attempt, result.outcome.value, at_step, result.reason)
    for failed in result.evidence.get("failed_ranks", [])[:1]:
        if failed["stderr_tail"]:  # the failing rank's own last words, where people look first
            logger.warning("last stderr lines of %s:\n%s", f"rank {failed['rank']}" if failed["rank"] is not None
                           else f"node {failed['node']}", "\n".join(failed["stderr_tail"]))
    return watched(result, steps_reported=not watcher.plain)  # a failed attempt's task is Failed, the flow goes on
