"""trainflow.reporting.audit: the origin tags a run records, and the trail read back from a real MLflow
SQLite store written the way the lifecycle writes it."""

from __future__ import annotations

import getpass
import socket
import time

import pytest
from typer.testing import CliRunner

from trainflow.cli import app
from trainflow.prefect.audit_events import add_events
from trainflow.reporting.audit import AuditError, launched_via, origin_tags, read_trail, without_credentials
from trainflow.reporting.audit_render import render_trail
from trainflow.reporting.tracking import Tracker


def test_origin_says_deployment_cli_or_flow():
    assert origin_tags("train") == {
        "launched_via": "deployment",
        "prefect_deployment": "train",
        "launched_by_user": getpass.getuser(),
        "launched_from_host": socket.gethostname(),
    }
    assert origin_tags(None)["launched_via"] == "flow"
    with launched_via("cli"):
        assert origin_tags(None)["launched_via"] == "cli"
        assert origin_tags("rerun")["launched_via"] == "deployment"  # a deployment's run says so, wherever it came from
    assert origin_tags(None)["launched_via"] == "flow"


def test_uris_lose_their_credentials():
    assert without_credentials("https://user:pw@host:9000/bucket") == "https://host:9000/bucket"
    assert without_credentials("s3://bucket/prefix") == "s3://bucket/prefix"


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri)
    original = tracker.start_run(
        "exp", "orig", {"trainflow.run_id": "orig-1", "spec_hash": "s" * 64, "team": "vision", **origin_tags("train")}
    )
    tracker.log_params(original, {"checkpoint_uri": "https://key:secret@minio:9000/ckpt", "world_size": 2})
    for attempt, outcome in [(1, "CRASHED"), (2, "SUCCEEDED")]:
        child = tracker.start_run(
            "exp",
            f"orig-1-attempt-{attempt}",
            {
                "trainflow.run_id": "orig-1",
                "attempt": str(attempt),
                "outcome": outcome,
                "reason": "rank 1 exited 3" if outcome == "CRASHED" else "finished",
            },
            parent=original,
        )
        tracker.log_params(child, {"world_size": 2, "resumed_from_step": 5 * (attempt - 1)})
        tracker.log_metrics(child, [("last_step", 7 if attempt == 1 else 10, 0, time.time())])
    with launched_via("cli"):
        rerun = tracker.start_run(
            "exp",
            "again",
            {
                "trainflow.run_id": "again-1",
                "rerun_of": original,
                "rerun_drift": "true",
                "rerun_allow_drift": "true",
                **origin_tags(None),
            },
        )
    tracker.log_json(
        rerun, ["environment: package x 1.0 is installed here but was not in the recorded run"], "rerun/drift.json"
    )
    return uri, original, rerun


def test_the_trail_of_a_deployment_run_and_its_rerun(store):
    uri, original, rerun = store
    trail = read_trail(uri, original)
    assert trail.origin["launched_via"] == "deployment" and trail.origin["prefect_deployment"] == "train"
    assert trail.identity["spec_hash"] == "s" * 64 and trail.team == "vision"
    assert [(a.attempt, a.outcome, a.resumed_from_step, a.last_step) for a in trail.attempts] == [
        (1, "CRASHED", 0, 7),
        (2, "SUCCEEDED", 5, 10),
    ]
    assert trail.reruns == [rerun]
    assert trail.params["checkpoint_uri"] == "https://minio:9000/ckpt"
    add_events(trail, None)
    assert trail.events == [] and "the run recorded no Prefect flow run" in trail.events_note
    text = render_trail(trail)
    assert "launched via deployment train by" in text and "1: CRASHED, world size 2, steps 0 → 7" in text
    assert "secret" not in text

    again = read_trail(uri, "again-1")  # by trainflow run id
    assert again.mlflow_run_id == rerun and again.origin["launched_via"] == "cli"
    assert again.drift == ["environment: package x 1.0 is installed here but was not in the recorded run"]
    assert f"rerun of {original}: drift true, --allow-drift given" in render_trail(again)


def test_an_unknown_run_is_bad_input(store):
    uri, _, _ = store
    with pytest.raises(AuditError, match="RUN_ID 'nope'"):
        read_trail(uri, "nope")
    result = CliRunner().invoke(app, ["audit", "nope", "--tracking-uri", uri])
    assert result.exit_code == 2 and "RUN_ID 'nope'" in result.stderr


def test_events_print_task_names_and_trainflows_own_payloads_whole():
    from trainflow.reporting.audit import AuditTrail, EventTrail

    reason = "rank 1 exited with code 3: " + "x" * 300
    trail = AuditTrail(
        mlflow_run_id="m",
        run_id="r",
        experiment="e",
        mlflow_status="FINISHED",
        started_at=0,
        ended_at=None,
        origin={},
        identity={},
        rerun={},
        drift=[],
        reruns=[],
        owner="",
        team="",
        params={},
        attempts=[],
        events=[
            EventTrail("t1", "prefect.task-run.Failed", "watch-attempt-1", {"state": "y" * 400}),
            EventTrail("t2", "trainflow.attempt.failed", "trainflow.run.r", {"reason": reason}),
        ],
    )
    lines = render_trail(trail).splitlines()
    [task] = [line for line in lines if "prefect.task-run.Failed" in line]
    assert "watch-attempt-1" in task and task.endswith("...")
    [own] = [line for line in lines if "trainflow.attempt.failed" in line]
    assert reason in own


def test_events_name_each_resource_by_its_newest_name_never_its_id():
    from trainflow.prefect.audit_events import resource_names

    task, flow_run, artifact = "prefect.task-run.0f1e", "prefect.flow-run.9a8b", "prefect.artifact.77aa"
    events = [  # oldest first, as Prefect sends them
        {
            "event": "prefect.task-run.Pending",
            "resource": {"prefect.resource.id": task, "prefect.resource.name": "watch-attempt-3f2"},
        },
        {
            "event": "prefect.task-run.Running",
            "resource": {"prefect.resource.id": task, "prefect.resource.name": "watch-attempt-1"},
            "related": [
                {
                    "prefect.resource.id": flow_run,
                    "prefect.resource.name": "digits-20261207",
                    "prefect.resource.role": "flow-run",
                }
            ],
        },
        {"event": "prefect.flow-run.heartbeat", "resource": {"prefect.resource.id": flow_run}},
        {
            "event": "prefect.artifact.created",
            "resource": {"prefect.resource.id": artifact},
            "payload": {"type": "progress"},
        },
        {"event": "prefect.artifact.updated", "resource": {"prefect.resource.id": artifact}, "payload": {"data": 40.0}},
    ]
    names = resource_names(events)
    assert names == {task: "watch-attempt-1", flow_run: "digits-20261207", artifact: "progress artifact"}
