"""A failing worker ends the run as failed, with teardown done and no process left behind; bad
input is refused before anything is created."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import (
    BUCKET,
    attempt_runs,
    job_processes,
    processes_of,
    run_cli,
    summary_of,
    unique_prefix,
)

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
EXITING = [
    "--set",
    "workload.entrypoint=tests/integration/workloads/exit_at_step.py",
    "--set",
    "workload.args=[--exit-at-step, '7', --exit-rank, '1', --exit-code, '3']",
    "--set",
    "workload.steps=20",
    "--set",
    "checkpoint.every_steps=5",
]


def test_worker_exiting_nonzero_fails_the_run_and_releases_everything(cli_env, s3):
    uri = unique_prefix()
    # without warm workers: every node's agent and ranks are interpreters of their own
    result = run_cli(
        [
            "run",
            SPEC,
            *EXITING,
            "--set",
            "fault_tolerance.max_restarts=0",
            "--set",
            "resources.warm_workers=false",
            "--set",
            f"checkpoint.uri={uri}",
            "--json",
        ],
        cli_env,
    )
    assert result.returncode == 1, result.stderr[-4000:]
    assert "2 node(s) started (0 warm)" in result.stdout + result.stderr
    summary = summary_of(result)
    assert summary["teardown"]["released_standbys"] == 0
    assert summary["status"] == "failed"
    assert [a["outcome"] for a in summary["attempts"]] == ["CRASHED"]
    assert "exited with code" in summary["reason"] and "budget" in summary["reason"]
    assert "reason:" in result.stdout
    assert summary["teardown"]["clean"] is True
    assert job_processes(summary["run_id"]) == []
    assert [c["step"] for c in summary["checkpoints"]] == [5]  # committed before the crash, kept
    run = MlflowClient(summary["tracking_uri"]).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert run.data.tags["status"] == "failed"


def test_crash_is_retried_from_the_last_committed_checkpoint(cli_env):
    uri = unique_prefix()
    # every attempt exits at step 7 of its own: the first from 0, the second resumes from 5 and
    # crashes at 7 again, which is a crash loop and stops the run
    result = run_cli(
        ["run", SPEC, *EXITING, "--set", "fault_tolerance.max_restarts=3", "--set", f"checkpoint.uri={uri}", "--json"],
        cli_env,
    )
    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)
    attempts = summary["attempts"]
    assert [a["outcome"] for a in attempts] == ["CRASHED", "CRASHED"], [a.get("reason") for a in attempts]
    assert attempts[1]["resumed_from_step"] == 5
    assert attempts[0]["lost_steps"] == attempts[0]["last_step"] - 5
    assert attempts[1]["recovery_s"] is not None and attempts[1]["recovery_s"] > 0
    assert "crash loop" in summary["reason"]
    assert job_processes(summary["run_id"]) == []
    client = MlflowClient(summary["tracking_uri"])
    experiment = client.get_experiment(client.get_run(summary["mlflow_run_id"]).info.experiment_id)
    # a training experiment: MLflow 3's UI opens it on its runs
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    children = attempt_runs(client, summary)
    assert sorted(c.data.tags["outcome"] for c in children) == ["CRASHED", "CRASHED"]
    first = next(c for c in children if c.data.tags["attempt"] == "1")
    assert first.data.params["resumed_from_step"] == "0"
    assert first.data.metrics["lost_steps"] == attempts[0]["lost_steps"]
    assert "detection_latency_s" in first.data.metrics or attempts[0]["detection_latency_s"] is None
    for child in children:  # each attempt's run spans the attempt and carries its own loss series
        row = attempts[int(child.data.tags["attempt"]) - 1]
        assert child.info.start_time / 1000 == pytest.approx(row["started_at"], abs=1.0)
        assert child.info.end_time / 1000 == pytest.approx(row["ended_at"], abs=1.0)
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "loss")]
        assert steps and row["resumed_from_step"] < min(steps), (row, steps)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["resources.nodes=0"], "resources.nodes"),
        (["resources.gpus=1"], "resources.gpus: unknown key"),
        (["parallel.data=3"], "world size"),
        (["checkpoint.keep_last=1"], "checkpoint.keep_last"),
        (["workload.entrypoint=missing/train.py"], "workload.entrypoint"),
        (["checkpoint.uri=s3://no-such-bucket-here/x"], "checkpoint.uri"),
        (["not-an-override"], "--set"),
    ],
)
def test_bad_input_exits_2_and_creates_nothing(cli_env, s3, tmp_path, overrides, field):
    objects_before = s3.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0)
    args = ["run", SPEC]
    for item in overrides:
        args += ["--set", item]
    result = run_cli(args, cli_env, timeout_s=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], result.stderr
    home = tmp_path / "home"
    assert not (home / "mlflow.db").exists() and not (home / "runs").exists()
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == objects_before
    assert processes_of(home) == []


def test_missing_spec_file_exits_2(cli_env, tmp_path):
    result = run_cli(["run", str(tmp_path / "nope.yaml")], cli_env, timeout_s=60)
    assert result.returncode == 2
    assert "nope.yaml: spec file not found" in result.stderr
