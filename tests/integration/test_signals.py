"""Stopping `trainflow run` from outside, on the embedded defaults (a temporary Prefect server,
MLflow on SQLite, a local checkpoint folder): Ctrl-C or SIGTERM to its process group ends the run
promptly with an emergency checkpoint and every MLflow run closed; a SIGKILLed orchestrator takes
its temporary server with it, and the next run reaps the workers it left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.integration.conftest import BIN, processes_of
from trainflow.backends.ports import is_listening

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
ANNOUNCE_AT_STEP = 30
DEADLINE_S = 240  # generous: the machine is shared; nothing here measures time


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory) -> Path:
    """One PREFECT_HOME for the module, so the temporary servers migrate its database once."""
    return tmp_path_factory.mktemp("prefect-home")


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def endless_run(home: Path, prefect_home: Path, marker: Path, *extra: str) -> subprocess.Popen:
    """`trainflow run` of a job far longer than any test, in its own process group (as a terminal
    would start it); rank 0 writes `marker` at step ANNOUNCE_AT_STEP. Only the end checkpoints on
    schedule, so any checkpoint committed before it is an emergency one."""
    env = {**os.environ, "TRAINFLOW_HOME": str(home), "PREFECT_HOME": str(prefect_home)}
    env.pop("PREFECT_API_URL", None)
    command = [
        str(BIN / "trainflow"),
        "run",
        SPEC,
        "--set",
        "workload.entrypoint=tests/integration/workloads/announce_step.py",
        "--set",
        f"workload.args=[--announce-at-step, '{ANNOUNCE_AT_STEP}', --marker, '{marker}']",
        "--set",
        "workload.steps=100000000",
        "--set",
        "checkpoint.every_steps=100000000",
        *extra,
    ]
    home.mkdir(parents=True, exist_ok=True)  # a second run shares the first one's home
    with open(home.parent / "stdout", "ab") as stdout, open(home.parent / "stderr", "ab") as stderr:
        proc = subprocess.Popen(
            command,
            env=env,
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            # a shell without job control starts background commands with SIGINT ignored; a terminal does not
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    proc.cwd_home = home
    return proc


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}:\n{stderr_of(proc)[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {DEADLINE_S} s:\n{stderr_of(proc)[-4000:]}")
        time.sleep(0.2)


def stderr_of(proc: subprocess.Popen) -> str:
    return (Path(proc.cwd_home).parent / "stderr").read_text(errors="replace")


def wait_exit(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"the run did not end within {DEADLINE_S} s:\n{stderr_of(proc)[-4000:]}") from None


def temporary_server(proc: subprocess.Popen) -> tuple[psutil.Process, int]:
    """The run's temporary Prefect server and its port."""
    for child in psutil.Process(proc.pid).children():
        command = child.cmdline()
        if "trainflow.prefect.server" in command:
            return child, int(command[-1])
    raise AssertionError("no temporary Prefect server among the run's children")


def wait_gone(home: Path) -> list[psutil.Process]:
    deadline = time.monotonic() + DEADLINE_S
    while (left := processes_of(home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def mlflow_runs(home: Path, attempts: bool = False) -> list:
    """The lifecycle runs recorded under `home`; with `attempts`, their nested attempt runs instead."""
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    runs = [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]
    return [run for run in runs if ("mlflow.parentRunId" in run.data.tags) == attempts]


def committed_steps(home: Path) -> list[int]:
    return sorted(json.loads(p.read_text())["step"] for p in (home / "checkpoints").rglob("manifest.json"))


def run_folders(home: Path) -> list[Path]:
    return list((home / "runs").glob("*")) if (home / "runs").exists() else []


def ended(proc: psutil.Process) -> bool:
    """Exited: gone, or a zombie its new parent has not reaped yet (its parent died first)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_process_group_ends_the_run_cleanly_with_an_emergency_checkpoint(
    home, prefect_home, tmp_path, signum
):
    marker = tmp_path / "training"
    proc = endless_run(home, prefect_home, marker)
    wait_for(marker.exists, proc, "training step")
    server, port = temporary_server(proc)

    os.killpg(proc.pid, signum)  # what Ctrl-C (SIGINT) or a scheduler's group SIGTERM does
    returncode = wait_exit(proc)

    stderr = stderr_of(proc)
    assert returncode == 128 + signum, stderr[-4000:]
    assert stderr.strip().splitlines()[-1] == f"trainflow: interrupted ({signal.Signals(signum).name})"
    assert "Traceback" not in stderr and "ConnectError" not in stderr, stderr[-4000:]
    # the emergency checkpoint: training went past the announced step, and no checkpoint was due
    assert committed_steps(home) and committed_steps(home)[-1] >= ANNOUNCE_AT_STEP
    runs = mlflow_runs(home)
    assert [r.info.status for r in runs] == ["KILLED"], [(r.info.run_name, r.info.status) for r in runs]
    assert runs[0].data.tags["reason"] == f"stopped by {signal.Signals(signum).name} before it finished"
    assert [r.info.status for r in mlflow_runs(home, attempts=True)] == ["KILLED"]
    assert run_folders(home) == []
    assert wait_gone(home) == []
    assert ended(server) and not is_listening(port)


MOMENTS = {
    "start-tracking": lambda home: (home / "mlflow.db").exists(),
    "provision": lambda home: any((home / "runs").glob("*/orchestrator.json")),
    "launch": lambda home: any((home / "runs").glob("*/attempt-1/node-*.log")),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_group_sigterm_early_in_the_run_leaves_nothing_open_or_behind(home, prefect_home, tmp_path, moment):
    proc = endless_run(home, prefect_home, tmp_path / "training")
    wait_for(lambda: MOMENTS[moment](home), proc, moment)
    server, port = temporary_server(proc)

    os.killpg(proc.pid, signal.SIGTERM)
    returncode = wait_exit(proc)

    stderr = stderr_of(proc)
    assert returncode == 128 + signal.SIGTERM, stderr[-4000:]
    assert "Traceback" not in stderr and "ConnectError" not in stderr, stderr[-4000:]
    everything = mlflow_runs(home) + mlflow_runs(home, attempts=True)
    assert [(r.info.run_name, r.info.status) for r in everything if r.info.status == "RUNNING"] == []
    assert run_folders(home) == []
    assert wait_gone(home) == []
    assert ended(server) and not is_listening(port)


def test_a_sigkilled_orchestrator_takes_its_server_and_agents_along_and_the_next_run_reaps_the_rest(
    home, prefect_home, tmp_path
):
    marker = tmp_path / "training"
    proc = endless_run(home, prefect_home, marker)
    wait_for(marker.exists, proc, "training step")
    server, port = temporary_server(proc)
    [run_folder] = run_folders(home)

    os.kill(proc.pid, signal.SIGKILL)  # the orchestrator alone: no teardown runs
    proc.wait()

    # the temporary server goes with it; the agents get SIGTERM and their workers save on the way out.
    # Once in a loaded run two workers were still there after 240 s: then the next run must reap them.
    wait_gone(home)
    assert ended(server) and not is_listening(port)
    # the agents' SIGTERM made the workers save an emergency checkpoint on the way out
    assert committed_steps(home) and committed_steps(home)[-1] >= ANNOUNCE_AT_STEP
    [killed] = mlflow_runs(home)
    [cut_short] = mlflow_runs(home, attempts=True)
    assert killed.info.status == cut_short.info.status == "RUNNING"  # nobody could close them yet

    # the next run reaps what the dead orchestrator recorded, and resumes from that checkpoint
    newest = committed_steps(home)[-1]
    resumed = endless_run(
        home,
        prefect_home,
        tmp_path / "resumed",
        "--resume",
        "--json",
        "--set",
        f"workload.steps={newest + 10}",
        "--set",
        f"checkpoint.every_steps={newest + 10}",
    )
    assert wait_exit(resumed) == 0, stderr_of(resumed)[-4000:]
    summary = json.loads((home.parent / "stdout").read_text().strip().splitlines()[-1])
    assert summary["status"] == "succeeded"
    assert summary["attempts"][0]["resumed_from_step"] == newest
    reaped = MlflowClient(summary["tracking_uri"]).get_run(killed.info.run_id)
    assert reaped.info.status == "FAILED"
    assert "the orchestrator died before teardown" in reaped.data.tags["reason"]
    assert MlflowClient(summary["tracking_uri"]).get_run(cut_short.info.run_id).info.status == "KILLED"
    assert not run_folder.exists() and run_folders(home) == []
    assert wait_gone(home) == []
