"""Recovery paths that need no injected fault: replicas that diverge, and an orchestrator that dies."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import BIN, job_processes, run_cli, summary_of

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"


def test_diverged_replicas_end_the_attempt_and_resume_from_the_last_checkpoint(cli_env):
    result = run_cli(
        [
            "run",
            SPEC,
            "--set",
            "workload.entrypoint=tests/integration/workloads/diverge_once.py",
            "--set",
            "workload.args=[--at-step, '25']",
            "--set",
            "workload.steps=40",
            "--set",
            "checkpoint.every_steps=10",
            "--set",
            "fault_tolerance.divergence_check_every_steps=10",
            "--json",
        ],
        cli_env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["DIVERGED", "SUCCEEDED"]
    assert "diverged at step 30" in summary["attempts"][0]["reason"]
    assert summary["attempts"][1]["resumed_from_step"] == 20  # the last checkpoint before the divergence
    assert summary["final_step"] == 40


def test_orchestrator_crash_leaves_no_orphans_and_resume_continues(cli_env, tmp_path):
    args = [
        "run",
        SPEC,
        "--set",
        "workload.steps=100000",
        "--set",
        "checkpoint.every_steps=200",
        "--set",
        "fault_tolerance.orchestrator_timeout_s=5",
    ]
    orchestrator = subprocess.Popen(
        [str(BIN / "trainflow"), *args], env=cli_env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    home = tmp_path / "home"
    checkpoints = home / "checkpoints" / "digits"
    deadline = time.monotonic() + 180
    while not list(checkpoints.glob("*/step-*/manifest.json")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert list(checkpoints.glob("*/step-*/manifest.json")), "no checkpoint committed in time"
    run_id = next((home / "runs").iterdir()).name
    assert job_processes(run_id)
    orchestrator.send_signal(signal.SIGKILL)  # the flow process dies mid-run: no teardown
    orchestrator.wait()

    # the agents get SIGTERM from the kernel and end their workers, which first save an emergency
    # checkpoint; torchrun gives them 30 s before SIGKILL, and a loaded machine needs all of it
    deadline = time.monotonic() + 5 + 30 + 60
    while job_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_processes(run_id) == [], "workers outlived their orchestrator"

    committed = max(
        int(p.parent.name.removeprefix("step-")) for p in checkpoints.glob(f"{run_id}/step-*/manifest.json")
    )
    resumed = run_cli(
        [
            "run",
            SPEC,
            "--set",
            f"workload.steps={committed + 20}",
            "--set",
            "checkpoint.every_steps=200",
            "--resume",
            "--json",
        ],
        cli_env,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = summary_of(resumed)
    assert summary["attempts"][0]["resumed_from_step"] == committed
    assert summary["final_step"] == committed + 20
    assert not (home / "runs" / run_id).exists()  # the dead run's scratch was reaped
    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary["tracking_uri"])
    dead = client.search_runs(
        [client.get_experiment_by_name("digits").experiment_id], filter_string=f"tags.`trainflow.run_id` = '{run_id}'"
    )
    # the run FAILED, its attempt cut short KILLED: nothing of the dead run is left RUNNING
    statuses = sorted((("mlflow.parentRunId" in r.data.tags), r.info.status) for r in dead)
    assert statuses == [(False, "FAILED"), (True, "KILLED")], statuses
    assert all("orchestrator died" in json.dumps(r.data.tags) for r in dead)
