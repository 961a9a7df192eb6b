"""teardown: release everything the run held, whatever happened, and check that it is gone."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from prefect import get_run_logger

from tasks import lifecycle_task
from trainflow.checkpoint.catalog import latest_verified
from trainflow.checkpoint.keep_local import keep_newer_local_checkpoints
from trainflow.checkpoint.storage import StorageError
from trainflow.home import trainflow_home
from trainflow.orchestrator.orphans import clear_unprovisioned
from trainflow.prefect.records import Launched, Provisioned, RunRecord
from trainflow.reporting.tracking import PARENT_TAG, Tracker, tracking_uri_for
from trainflow.runspec import RunSpec

T = TypeVar("T")
WRITE_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 8.0)  # a SQLite store locked by another writer frees up


@lifecycle_task(name="teardown")
def teardown(
    spec: RunSpec,
    run_id: str,
    record: RunRecord | None,
    provisioned: Provisioned | None,
    last_attempt: Launched | None,
    summary: dict | None,
    stopped_by: str | None = None,
) -> dict:
    """Stop every process of the job (a stopped run's attempt first with SIGTERM, so it saves an
    emergency checkpoint), free its ports and scratch, close the status channel, close every MLflow
    run it opened, and report what was released and anything that survived. `record`,
    `provisioned` and `last_attempt` are None when the run was stopped before they existed, and
    `summary` unless finalize closed the run; `stopped_by` names the signal that stopped it."""
    logger = get_run_logger()
    finalized = summary is not None
    report: dict = {"stopped_processes": 0, "released_ports": [], "removed_paths": [], "survivors": [], "clean": True}
    try:
        if provisioned is not None:
            if last_attempt is not None and not finalized:
                grace_s = spec.fault_tolerance.preemption_grace_s
                stopped = provisioned.launcher.stop(last_attempt.handle, grace_s=grace_s)
                logger.info(
                    "attempt %d stopped (%d process(es); SIGTERM, then SIGKILL after %g s)",
                    last_attempt.attempt,
                    stopped,
                    grace_s,
                )
            provisioned.live.close()  # the status channel, and any commit feed still open
            kept = keep_undurable_state(run_id, provisioned, logger)
            kept += keep_unrecorded_logs(run_id, provisioned, logger)
            report = provisioned.launcher.release(provisioned.allocation).as_dict()
            report["kept_paths"] = kept
            report["status_channel_closed"] = True
        elif record is not None:
            report = clear_unprovisioned(run_id)  # stopped inside provision: what it had reserved so far
    finally:
        close_tracking(spec, run_id, record, provisioned, report, finalized, stopped_by, logger)
    if report["clean"]:
        logger.info(
            "teardown: %d process(es) stopped, %d standby interpreter(s) released, ports %s released, "
            "%d path(s) removed",
            report["stopped_processes"],
            report.get("released_standbys", 0),
            report["released_ports"],
            len(report["removed_paths"]),
        )
    else:
        logger.error("teardown left survivors: %s", "; ".join(report["survivors"]))
    return report


def keep_undurable_state(
    run_id: str, provisioned: Provisioned, logger: logging.Logger | logging.LoggerAdapter
) -> list[str]:
    """Move a node-local checkpoint newer than the store's newest verified one out of the scratch
    that release removes: it is the only copy of the newest state."""
    try:
        durable = latest_verified(provisioned.storage, run_id)
    except StorageError as exc:
        logger.warning("checkpoint store unreadable at teardown (%s): keeping the newest node-local copy", exc)
        durable = None
    destination = trainflow_home() / "kept" / run_id
    try:
        kept = keep_newer_local_checkpoints(
            provisioned.allocation.scratch, run_id, durable.step if durable else None, destination
        )
    except OSError as exc:
        logger.error("could not keep the newest node-local checkpoint of %s: %s", run_id, exc)
        return []
    if kept:
        logger.warning(
            "the newest state is only on the nodes (newer than the store's step %s): kept in %s",
            durable.step if durable else "none",
            destination,
        )
    return kept


def keep_unrecorded_logs(
    run_id: str, provisioned: Provisioned, logger: logging.Logger | logging.LoggerAdapter
) -> list[str]:
    """When the tracking store dropped writes, the attempts' logs may be nowhere else: move them out of
    the scratch that release removes (a rename, which a full disk still allows)."""
    tracker = provisioned.tracker
    if not tracker.dropped_writes and tracker.fault() is None:
        return []
    destination = trainflow_home() / "kept" / run_id / "logs"
    kept = []
    for attempt_dir in sorted(provisioned.allocation.scratch.glob("attempt-*")):
        try:
            destination.mkdir(parents=True, exist_ok=True)
            kept.append(str(shutil.move(str(attempt_dir), str(destination / attempt_dir.name))))
        except OSError as exc:
            logger.error("could not keep the logs of %s (%s): %s", attempt_dir.name, run_id, exc)
    if kept:
        logger.warning(
            "the tracking store did not record %d write(s): the attempts' logs are kept in %s",
            tracker.dropped_writes,
            destination,
        )
    return kept


def close_tracking(
    spec: RunSpec,
    run_id: str,
    record: RunRecord | None,
    provisioned: Provisioned | None,
    report: dict,
    finalized: bool,
    stopped_by: str | None,
    logger: logging.Logger | logging.LoggerAdapter,
) -> None:
    """Leave no MLflow run of this lifecycle RUNNING: attempts cut short are KILLED, the run itself
    FAILED (KILLED when a signal stopped it) unless finalize closed it."""
    persist = partial(persist_write, logger=logger)
    experiment = record.experiment if record else spec.tracking.experiment or spec.name
    uri = record.tracking_uri if record else tracking_uri_for(spec)
    tracker = provisioned.tracker if provisioned else persist(lambda: Tracker(uri, spec.tracking.store_patience_s))
    if tracker is None:
        return
    if record is None:  # stopped while start-tracking ran: the run it may have opened carries run_id
        ended = persist(lambda: tracker.end_running(experiment, f"tags.`trainflow.run_id` = '{run_id}'", "KILLED"))
        if ended:
            logger.warning("MLflow run(s) %s of %s ended KILLED", ", ".join(ended), run_id)
        return
    run = record.mlflow_run_id
    ended = persist(lambda: tracker.end_running(experiment, f"tags.`{PARENT_TAG}` = '{run}'", "KILLED"))
    if ended:
        logger.warning("attempt run(s) %s were still open: ended KILLED", ", ".join(ended))
    persist(lambda: tracker.log_json(run, report, "teardown.json"))
    persist(lambda: tracker.set_tags(run, {"teardown_clean": str(report["clean"]).lower()}))
    if finalized or persist(lambda: tracker.run_status(run)) in ("FINISHED", "FAILED", "KILLED"):
        return
    if stopped_by:
        tags = {"status": "killed", "reason": f"stopped by {stopped_by} before it finished"}
    else:
        tags = {"status": "failed", "reason": "the lifecycle stopped before finalize"}
    persist(lambda: tracker.set_tags(run, tags))
    persist(lambda: tracker.end_run(run, "KILLED" if stopped_by else "FAILED"))


def persist_write(write: Callable[[], T], logger: logging.Logger | logging.LoggerAdapter) -> T | None:
    """One of teardown's MLflow writes, retried while the store is locked; a write that still fails
    is logged and skipped, so the writes after it (closing the run) are still tried."""
    for delay in (*WRITE_RETRY_DELAYS_S, None):
        try:
            return write()
        except Exception as exc:  # noqa: BLE001 - MLflow wraps the store's errors in several types
            if delay is not None and "locked" in str(exc).lower():
                logger.warning("the MLflow store is locked by another writer; retrying in %g s", delay)
                time.sleep(delay)
                continue
            logger.error("teardown could not write to MLflow: %s: %s", type(exc).__name__, exc)
            return None
    return None
