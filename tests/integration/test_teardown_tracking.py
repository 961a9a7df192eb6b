"""Teardown's MLflow writes on a real SQLite store: nothing it opened stays RUNNING, even when
another writer holds the store's lock for a while (SQLite's "database is locked")."""

from __future__ import annotations

import logging
import sqlite3

import pytest
from mlflow.tracking import MlflowClient

from tasks.teardown import close_tracking
from tests.conftest import ROOT
from trainflow.prefect.records import RunRecord
from trainflow.reporting.tracking import Tracker
from trainflow.runspec import load_spec

pytestmark = pytest.mark.integration

REPORT = {"stopped_processes": 0, "released_ports": [], "removed_paths": [], "survivors": [], "clean": True}


class ReleaseLockOnRetry(logging.Handler):
    """Ends the other writer's transaction once teardown says it met the lock and will retry."""

    def __init__(self, holder: sqlite3.Connection):
        super().__init__()
        self.holder = holder
        self.retries = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "locked" in record.getMessage() and self.holder.in_transaction:
            self.retries += 1
            self.holder.execute("ROLLBACK")


def test_a_stopped_run_and_its_open_attempt_are_killed_even_while_the_store_is_locked(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path))
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    tracker = Tracker(uri)
    parent = tracker.start_run("digits", "digits-1", tags={"trainflow.run_id": "digits-1"})
    attempt = tracker.start_run("digits", "digits-1-attempt-1", tags={"attempt": "1"}, parent=parent)
    spec = load_spec(ROOT / "examples/digits/spec.yaml")
    record = RunRecord(
        spec=spec,
        run_id="digits-1",
        mlflow_run_id=parent,
        tracking_uri=uri,
        experiment="digits",
        prefect_flow_run_id="",
        started_at=0.0,
    )

    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)  # released from the writer thread
    holder.execute("BEGIN EXCLUSIVE")  # another writer, mid-transaction
    logger = logging.getLogger("test-teardown")
    writes = logging.getLogger("trainflow.tracking")  # where the tracker says it met the lock and retries
    released = ReleaseLockOnRetry(holder)
    writes.addHandler(released)
    try:
        close_tracking(spec, "digits-1", record, None, REPORT, finalized=False, stopped_by="SIGINT", logger=logger)
    finally:
        writes.removeHandler(released)
        holder.close()

    assert released.retries == 1  # the store really was locked when teardown first wrote
    client = MlflowClient(uri)
    assert client.get_run(attempt).info.status == "KILLED"
    run = client.get_run(parent)
    assert run.info.status == "KILLED"
    assert run.data.tags["status"] == "killed"
    assert run.data.tags["reason"] == "stopped by SIGINT before it finished"
    assert run.data.tags["teardown_clean"] == "true"
