"""watch_attempt: follow one attempt until it ends, recording metrics and passing on commits."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.states import State

from tasks import lifecycle_task
from tasks.attempts import STOP_GRACE_S
from trainflow.backends.abilities import PreemptsNodes, ReplacesNodes
from trainflow.checkpoint.plain_copies import read_restores
from trainflow.checkpoint.storage import StorageError
from trainflow.contracts.status_protocol import Checkpoint, Error, Layout, Preempted, RestartedInPlace, Restored
from trainflow.orchestrator import progress
from trainflow.orchestrator.failures import AttemptResult
from trainflow.orchestrator.grow_back import GrowBack
from trainflow.orchestrator.live import CommitFeed
from trainflow.orchestrator.plain_copies import CopyFeed
from trainflow.orchestrator.status import RankReport
from trainflow.orchestrator.stragglers import Straggler
from trainflow.orchestrator.watcher import AttemptWatcher, WatchLimits
from trainflow.prefect.attempt_states import watched
from trainflow.prefect.output_tail import sampled_output
from trainflow.prefect.records import Launched
from trainflow.prefect.ui import report_progress
from trainflow.reporting.tracking_writes import metric_name_problem


@lifecycle_task(name="watch-attempt", task_run_name="watch-attempt-{launched.handle.attempt}")
def watch_attempt(launched: Launched, commits: CommitFeed) -> AttemptResult | State:
    """Watch exits, heartbeats and progress until the attempt ends; each commit goes to `commits`,
    which the flow snapshots from until this task is over (the flow ends the feed then, however the
    task ended)."""
    logger = get_run_logger()
    spec, record, provisioned, handle = launched.spec, launched.record, launched.provisioned, launched.handle

    grow_back = way_back(launched)

    def on_event(event: RankReport | Straggler) -> None:
        match event:
            case RankReport(message=Checkpoint() as checkpoint):
                commits.publish(event.as_dict())
                if grow_back is not None and checkpoint.status == "committed":
                    if grow_back.at_commit(checkpoint.step):
                        logger.warning("attempt %d: %s", handle.attempt, grow_back.requested)
                    elif grow_back.unanswered is not None:
                        logger.warning("could not ask whether the left-out node(s) are back: %s", grow_back.unanswered)
                        grow_back.unanswered = None
            case RankReport(rank=rank, message=Error() as error):
                logger.error("rank %s: %s: %s", rank, error.type, error.message)
            case RankReport(rank=0, message=RestartedInPlace() as restart):
                logger.warning(
                    "attempt %d: %s; every rank went back to its memory copy of step %d in place (round %d, "
                    "%s retry), rank 0 %.2fs after the failure",
                    handle.attempt,
                    restart.reason,
                    restart.restored_step,
                    restart.round,
                    restart.outcome,
                    restart.t - restart.failed_at,
                )
            case RankReport(rank=rank, message=Restored() as restored):
                logger.info(
                    "rank %s restored step %s (%s) in %.2fs%s",
                    rank,
                    restored.step,
                    restored.tier,
                    restored.seconds,
                    f"; passed over: {restored.fallbacks}" if restored.fallbacks else "",
                )
                if rank == 0:
                    for skipped in restored.fallbacks:  # which checkpoint was passed over, and why
                        logger.warning("checkpoint skipped at restore: %s", skipped)
            case Straggler(rank=rank, node=node, score=score, step=step):
                logger.warning(
                    "rank %s on node %s is a straggler (compute %.1fx the others') at step %s", rank, node, score, step
                )
            case RankReport(message=Layout() as layout):
                logger.info(
                    "attempt %d layout: %s, world size %s, dp %s, tp %s, pp %s",
                    handle.attempt,
                    layout.strategy,
                    layout.world_size,
                    layout.dp_degree,
                    layout.tp_degree,
                    layout.pp_degree,
                )
                for warning in layout.warnings:
                    logger.warning("layout: %s", warning)
                if layout.warnings:
                    provisioned.tracker.set_tags(record.mlflow_run_id, {"layout_warnings": " | ".join(layout.warnings)})
            case RankReport(rank=rank, message=Preempted(signalled=True, step=step)):
                logger.warning("rank %s was preempted: emergency checkpoint at step %s", rank, step)

    def on_metrics(rows: list) -> None:
        steps = [(step, value) for key, value, step, _ in rows if key == "loss"]
        if steps:
            progress.publish(steps[-1][0], spec.workload.steps, handle.attempt, steps[-1][1])
        for name in provisioned.tracker.log_metrics(record.mlflow_run_id, rows):  # once per name
            logger.warning("metric %r is not recorded: %s", name, metric_name_problem(name))
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
            plain_startup_window_s=spec.fault_tolerance.plain_startup_window_s,
        ),
        world_size=spec.world_size,
        resumed_from_step=launched.resumed_from_step,
        on_metrics=on_metrics,
        on_event=on_event,
        step_metrics_every_s=spec.tracking.step_metrics_every_s,
        mean_metrics=tuple(spec.tracking.mean_metrics),
        final_step=spec.workload.steps,
        plain=spec.workload.mode.value == "plain",
        fault_tolerance=spec.fault_tolerance,
        tracking_fault=provisioned.tracker.fault,
    )
    copies = None
    if watcher.plain and spec.workload.plain.checkpoint_dir:  # node 0 commits copies of the script's folder
        copies = CopyFeed(provisioned.storage, record.run_id, handle.attempt, commits.publish)
        copies.start()
    try:
        with sampled_output(handle, logger):  # a bounded tail of the training output, while it trains
            result = watcher.run()
        if grow_back is not None:
            result = grow_back.resized(result)
        if result.evidence.storage_calls:
            # a storage outage: the flow may be waiting on the same store to snapshot a commit, and
            # until it releases the attempt the workers would train on past the verdict once it answers
            provisioned.launcher.stop(handle, grace_s=STOP_GRACE_S)
        if result.evidence.tracking_store is not None:
            # as a stop does: SIGTERM, and the workers save an emergency checkpoint before they exit
            provisioned.launcher.stop(handle, grace_s=spec.fault_tolerance.preemption_grace_s)
    finally:
        if copies is not None:
            copies.stop()
    if copies is not None:
        note_restores(launched, result)
    log = logger.info if result.outcome.value == "SUCCEEDED" else logger.warning
    at_step = "" if watcher.plain else f" at step {result.last_step}"  # a plain script reports no steps
    log("attempt %d ended %s%s: %s", result.attempt, result.outcome.value, at_step, result.reason)
    for failed in result.evidence.failed_ranks[:1]:
        if failed.stderr_tail:  # the failing rank's own last words, where people look first
            logger.warning(
                "last stderr lines of %s:\n%s",
                f"rank {failed.rank}" if failed.rank is not None else f"node {failed.node}",
                "\n".join(failed.stderr_tail),
            )
    return watched(result, steps_reported=not watcher.plain)  # a failed attempt's task is Failed, the flow goes on


def way_back(launched: Launched) -> GrowBack | None:
    """How this attempt grows back to the run's size, where a shrink left node slots out and the
    backend can both bring a slot back and stop an attempt as a preemption does; else None."""
    spec, provisioned, handle = launched.spec, launched.provisioned, launched.handle
    launcher, allocation = provisioned.launcher, provisioned.allocation
    if not allocation.left_out or spec.workload.mode.value == "plain":  # a plain script has no emergency checkpoint
        return None
    if not isinstance(launcher, ReplacesNodes) or not isinstance(launcher, PreemptsNodes):
        return None
    return GrowBack(
        slots=list(allocation.left_out),
        nodes=handle.nodes,
        final_step=spec.workload.steps,
        available=lambda slot: launcher.replace_node(allocation, slot),
        stop=lambda: launcher.preempt_node(handle, 0),  # one node's SIGTERM: every rank stops at the same step
    )


def note_restores(launched: Launched, result: AttemptResult) -> None:
    """Which copy of a plain script's folder each node restored (and what it passed over), as the
    nodes recorded it in the store: node 0's is the attempt's `resumed_from`."""
    storage, record = launched.provisioned.storage, launched.record
    try:
        restores = read_restores(storage, record.run_id, result.attempt)
    except StorageError as exc:
        get_run_logger().warning("could not read which copy the nodes restored: %s", exc)
        return
    if not restores:
        return
    result.evidence.restores = restores
    restored = next((r["restored"] for r in restores if r.get("restored")), None)
    result.resumed_from = f"{storage.uri}/{restored}" if restored else None
    for entry in restores:
        for rejected in entry.get("rejected", []):
            get_run_logger().warning(
                "node %s passed over copy %s/%s: %s",
                entry.get("node"),
                storage.uri,
                rejected["prefix"],
                rejected["reason"],
            )
    if result.resumed_from:
        get_run_logger().info("attempt %d resumed from %s", result.attempt, result.resumed_from)
