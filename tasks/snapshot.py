"""snapshot_checkpoint: verify a checkpoint the workers committed, record it, apply retention."""

from __future__ import annotations

from prefect import get_run_logger

from tasks import lifecycle_task
from tasks.records import CheckpointRecord, Provisioned, RunRecord
from trainflow.checkpoint.catalog import Committed, apply_retention, missing_or_resized, read_manifest
from trainflow.checkpoint.manifest import ManifestError
from trainflow.checkpoint.storage import StorageError, open_storage
from trainflow.home import resolve_checkpoint_uri
from trainflow.spec import RunSpec


@lifecycle_task(name="snapshot-checkpoint", task_run_name="snapshot-step-{commit[step]}")
def snapshot_checkpoint(spec: RunSpec, record: RunRecord, provisioned: Provisioned, commit: dict) -> CheckpointRecord:
    """Check the committed manifest and its files in the store, then keep only the newest K."""
    logger = get_run_logger()
    storage = open_storage(resolve_checkpoint_uri(spec.checkpoint.uri))
    uri = f"{storage.uri}/{commit['prefix']}"
    try:
        checkpoint = Committed(commit["prefix"], read_manifest(storage, commit["prefix"]))
        problems = missing_or_resized(storage, checkpoint)
    except (ManifestError, StorageError) as exc:
        problems = [str(exc)]
    verified = not problems
    tracker, run = provisioned.tracker, record.mlflow_run_id
    step = int(commit["step"])
    tracker.log_metrics(
        run,
        [
            ("checkpoint_bytes", commit["bytes"], step, commit["t"]),
            ("checkpoint_stage_s", commit["stage_s"], step, commit["t"]),
            ("checkpoint_save_s", commit["save_s"], step, commit["t"]),
            ("checkpoint_upload_s", commit["upload_s"], step, commit["t"]),
        ],
    )
    if not verified:
        logger.error("checkpoint at step %d failed verification: %s", step, "; ".join(problems))
        return CheckpointRecord(step, uri, False, commit["bytes"], commit.get("attempt", 0), "; ".join(problems))
    deleted = apply_retention(storage, record.run_id, spec.checkpoint.keep_last)
    logger.info(
        "checkpoint step %d committed (%.1f kB)%s", step, commit["bytes"] / 1e3,
        f"; retention removed steps {deleted}" if deleted else "",
    )
    return CheckpointRecord(step, uri, True, commit["bytes"], commit.get("attempt", 0))
