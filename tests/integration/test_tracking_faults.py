"""Training never depends on the tracking store: a metric MLflow cannot take is left out with one
warning, a store locked by another process for longer than SQLite's busy timeout is waited out while
training goes on, and a store that stays unwritable (its disk full) ends the run INFRA, with the
workers' emergency checkpoint committed, the attempts' logs kept and the summary printed."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.integration.conftest import BIN, run_cli, summary_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SPEC = "examples/digits/spec.yaml"
WORKLOAD = "tests/integration/workloads/tracking_probe.py"
LONG_NAME = "m" * 300  # MLflow takes 250 characters
SQLITE_BUSY_TIMEOUT_S = 20  # MLflow's PRAGMA busy_timeout on SQLite


def probe_args(steps: int, workload_args: list[str], *more: str) -> list[str]:
    return [
        "run",
        SPEC,
        "--set",
        f"workload.entrypoint={WORKLOAD}",
        "--set",
        f"workload.args={json.dumps(workload_args)}",
        "--set",
        f"workload.steps={steps}",
        "--set",
        "checkpoint.every_steps=20",
        "--set",
        "tracking.step_metrics_every_s=0",
        *more,
        "--json",
    ]


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def step_of(progress: Path) -> int:
    try:
        return int(progress.read_text() or -1)
    except (OSError, ValueError):
        return -1


def start_cli(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "trainflow"), *args], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish_cli(proc: subprocess.Popen, timeout_s: float) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"trainflow run still running after {timeout_s:g} s\n{stderr[-6000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_a_metric_mlflow_cannot_take_is_left_out_with_one_warning(cli_env, tmp_path):
    result = run_cli(probe_args(30, ["--progress", str(tmp_path / "progress"), "--metric-name", LONG_NAME]), cli_env)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert summary["status"] == "succeeded" and summary["final_step"] == 30
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "is not recorded" in line]
    assert len(warnings) == 1 and LONG_NAME in warnings[0] and "300 characters" in warnings[0], warnings
    client = MlflowClient(summary["tracking_uri"])
    assert len(client.get_metric_history(summary["mlflow_run_id"], "loss")) == 30
    attempts = client.search_runs(
        [client.get_run(summary["mlflow_run_id"]).info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{summary['mlflow_run_id']}'",
    )
    assert [run.data.tags["outcome"] for run in attempts] == ["SUCCEEDED"]


def test_a_store_locked_longer_than_sqlites_busy_timeout_is_waited_out_while_training_goes_on(cli_env, tmp_path):
    progress, release = tmp_path / "progress", tmp_path / "release"
    steps, hold_at = 160, 150  # held at step 150 until the store is free again, so the run ends after
    database = Path(cli_env["TRAINFLOW_HOME"]) / "mlflow.db"
    proc = start_cli(
        probe_args(
            steps,
            [
                "--progress",
                str(progress),
                "--step-pause-s",
                "0.1",
                "--hold-at-step",
                str(hold_at),
                "--release",
                str(release),
            ],
            "--set",
            "fault_tolerance.hang_timeout_s=600",
        ),
        cli_env,
    )  # a hold is no hang
    holder = None
    try:
        wait_for(lambda: step_of(progress) >= 5, 180, "the first steps")
        locked = tmp_path / "locked"
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
                    "db.execute('BEGIN EXCLUSIVE'); open(sys.argv[2], 'w').close(); time.sleep(float(sys.argv[3]))"
                ),
                str(database),
                str(locked),
                str(SQLITE_BUSY_TIMEOUT_S * 2),
            ]
        )
        wait_for(locked.exists, 60, "the other process's lock")
        at_lock = step_of(progress)
        assert holder.wait(timeout=SQLITE_BUSY_TIMEOUT_S * 2 + 60) == 0  # the lock ends with its process
        at_unlock = step_of(progress)
        release.touch()
        result = finish_cli(proc, 400)
    finally:
        release.touch()
        if holder is not None and holder.poll() is None:
            holder.kill()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert result.returncode == 0, result.stderr[-4000:]
    assert at_unlock > at_lock, (at_lock, at_unlock)  # training went on while the store was locked
    output = result.stdout + result.stderr
    assert "the store refused a write" in output and "database is locked" in output, output[-4000:]
    summary = summary_of(result)
    assert summary["status"] == "succeeded" and summary["final_step"] == steps
    client = MlflowClient(summary["tracking_uri"])
    history = client.get_metric_history(summary["mlflow_run_id"], "loss")
    assert sorted(point.step for point in history) == list(range(1, steps + 1))  # every step, none lost
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "succeeded"


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str):
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        folder.rmdir()


def fill(folder: Path) -> None:
    """Take every free byte of the file system `folder` is on."""
    with open(folder / "filler", "wb") as filler:
        chunk = b"\0" * (1 << 16)
        with contextlib.suppress(OSError):
            while True:
                filler.write(chunk)
                filler.flush()


def test_a_store_whose_disk_stays_full_ends_the_run_infra_with_its_state_checkpointed(cli_env, tmp_path):
    progress = tmp_path / "progress"
    home = Path(cli_env["TRAINFLOW_HOME"])
    with small_tmpfs(tmp_path / "store", "64m") as store:
        # 2000 steps of at least 50 ms: training outlasts the store's patience by far
        proc = start_cli(
            probe_args(
                2000,
                ["--progress", str(progress)],
                "--set",
                f"tracking.uri=sqlite:///{store}/mlflow.db",
                "--set",
                "tracking.store_patience_s=10",
            ),
            cli_env,
        )
        try:
            wait_for(lambda: step_of(progress) >= 25, 180, "the first checkpoint's steps")
            fill(store)
            full_at = step_of(progress)
            result = finish_cli(proc, 400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)  # the summary is printed although the store took none of it
    assert summary["status"] == "failed"
    assert [a["outcome"] for a in summary["attempts"]] == ["INFRA"]
    assert "tracking store refused every write" in summary["reason"] and "not retried" in summary["reason"]
    assert "reason:" in result.stdout
    # the workers' emergency checkpoint: at or after the step the disk filled, committed and verified
    newest = max(summary["checkpoints"], key=lambda c: c["step"])
    assert newest["verified"] and newest["step"] >= full_at > 20, (summary["checkpoints"], full_at)
    kept_logs = home / "kept" / summary["run_id"] / "logs" / "attempt-1"
    assert any(kept_logs.rglob("*.log")), sorted(str(p) for p in home.rglob("*"))
    assert not (home / "runs" / summary["run_id"]).exists()
