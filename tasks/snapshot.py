"""snapshot_checkpoint: verify a snapshot the workers committed, record it, apply retention.

The workers upload their own shards and rank 0 commits the manifest (see
trainflow/runtime/publish.py); each commit, failed snapshot, or checkpoint rejected at restore
arrives here as one "checkpoint" event. Retention and the clean-up of interrupted uploads run here,
in the orchestrator, never on the training path.
"""

from __future__ import annotations

from prefect import get_run_logger

from tasks import lifecycle_task
from trainflow.checkpoint.catalog import (
    Committed,
    abort_stale_uploads,
    apply_retention,
    missing_or_resized,
    read_manifest,
)
from trainflow.checkpoint.manifest import ManifestError
from trainflow.checkpoint.storage import StorageError
from trainflow.prefect.records import CheckpointRecord, Launched

TIMINGS = ("stage_s", "save_s", "hash_s", "upload_s", "commit_s")


@lifecycle_task(name="snapshot-checkpoint", task_run_name="snapshot-step-{commit[step]}")
def snapshot_checkpoint(launched: Launched, commit: dict) -> CheckpointRecord:
    """Check the committed manifest and its files in the store, record the figures, then keep only
    what retention promises; a failed or rejected checkpoint is recorded as such."""
    logger = get_run_logger()
    spec, record = launched.spec, launched.record
    storage = launched.provisioned.storage
    uri = f"{storage.uri}/{commit['prefix']}"
    tracker, run = launched.provisioned.tracker, record.mlflow_run_id
    step, at, size = int(commit["step"]), commit["t"], int(commit.get("bytes", 0))
    status = commit.get("status", "committed")

    if status != "committed":
        reason = commit.get("reason", "unknown")
        if status == "rejected":
            logger.warning("checkpoint at step %d was not loaded (%s): %s", step, uri, reason)
        else:
            logger.error("checkpoint at step %d was not committed: %s", step, reason)
        tracker.log_metrics(run, [(f"checkpoint_{status}", 1.0, step, at)])
        return CheckpointRecord(step, uri, False, size, commit.get("attempt", 0), f"{status}: {reason}")

    try:
        checkpoint = Committed(commit["prefix"], read_manifest(storage, commit["prefix"]))
        problems = missing_or_resized(storage, checkpoint)
    except (ManifestError, StorageError) as exc:
        problems = [str(exc)]
    figures = [(f"checkpoint_{name}", commit[name], step, at) for name in TIMINGS if name in commit]
    figures.append(("checkpoint_bytes", size, step, at))
    if commit.get("upload_s"):
        figures.append(("checkpoint_upload_MBps", size / 1e6 / commit["upload_s"], step, at))
    if commit.get("save_s"):
        figures.append(("checkpoint_write_MBps", size / 1e6 / commit["save_s"], step, at))
    tracker.log_metrics(run, figures)
    if problems:
        logger.error("checkpoint at step %d failed verification: %s", step, "; ".join(problems))
        return CheckpointRecord(step, uri, False, size, commit.get("attempt", 0), "; ".join(problems))

    deleted: list[int] = []
    try:
        # commits arrive in order: what is newer than this step is not verified and recorded yet
        deleted = apply_retention(
            storage, record.run_id, spec.checkpoint.keep_last, spec.checkpoint.keep_every_steps, up_to_step=step
        )
    except StorageError as exc:  # the store went away after the commit: retention waits for the next snapshot
        logger.warning("retention skipped this time: %s", exc)
    aborted: list[str] = []
    try:
        aborted = abort_stale_uploads(storage, record.run_id, step)
    except StorageError as exc:  # worth another try at the next snapshot
        logger.warning("could not clean up interrupted uploads: %s", exc)
    logger.info(
        "checkpoint step %d committed (%.1f kB, upload %.2fs)%s%s",
        step,
        size / 1e3,
        commit.get("upload_s", 0.0),
        f"; retention removed steps {deleted}" if deleted else "",
        f"; aborted {len(aborted)} interrupted upload(s)" if aborted else "",
    )
    return CheckpointRecord(step, uri, True, size, commit.get("attempt", 0))
