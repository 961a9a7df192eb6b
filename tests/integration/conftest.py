"""The integration tests: the session's real servers (tests/servers.py), finished runs several
modules read, and `trainflow` run as a user would."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.servers import BIN, BUCKET, s3_environment, start_server  # noqa: F401  test modules import them from here
from trainflow.backends.stacks import py_spy_dump
from trainflow.drills.servers import stop_server  # noqa: F401  imported from here by test modules
from trainflow.worker_config import JOB_ENV


@pytest.fixture(scope="session")
def finished_runs(tmp_path_factory, prefect_api, s3_endpoint):
    """Finished real runs that several modules only read (tests/integration/finished_runs.py), made once."""
    from tests.integration.finished_runs import make_finished_runs  # it imports this module's helpers

    return make_finished_runs(tmp_path_factory.mktemp("finished-runs"), prefect_api, s3_endpoint)


def attempt_runs(client, summary: dict) -> list:
    """The MLflow runs of a run's attempts (nested under its lifecycle run), attempt 1 first."""
    runs = client.search_runs(
        [client.get_run(summary["mlflow_run_id"]).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{summary['mlflow_run_id']}'",
    )
    return sorted(runs, key=lambda run: int(run.data.tags["attempt"]))


def unique_prefix() -> str:
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:8]}"


def run_cli(args: list[str], env: dict, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """A `trainflow` command run to its end. One still running after `timeout_s` fails the test with
    its stderr's tail and the stacks of it and every process under it, all of which are then ended."""
    command = [str(BIN / "trainflow"), *args]
    with subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            tree = _tree(proc.pid)
            stacks = "\n".join(_stacks(process) for process in tree)
            for process in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            try:
                stdout, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # a process outside the tree still holds its pipes
                stdout, stderr = "", "(its output pipes are still held open by another process)"
            pytest.fail(
                f"trainflow {' '.join(args[:2])} still running after {timeout_s:g} s\n"
                f"stderr (tail):\n{stderr[-6000:]}\n{stacks}"
            )
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _stacks(process: psutil.Process) -> str:
    try:
        return f"--- {process.pid}: {' '.join(process.cmdline())[:300]}\n{py_spy_dump(process.pid)}"
    except psutil.NoSuchProcess:
        return f"--- {process.pid}: gone"


def summary_of(result: subprocess.CompletedProcess) -> dict:
    lines = result.stdout.strip().splitlines()
    assert lines, f"no stdout; stderr:\n{result.stderr[-4000:]}"
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise AssertionError(
            f"last stdout line is not JSON:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        ) from None


def job_processes(run_id: str) -> list[psutil.Process]:
    """Processes still carrying the job's marker (checked independently of trainflow's teardown)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(JOB_ENV) == run_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def processes_of(home: str | Path) -> list[psutil.Process]:
    """Every live process started for this TRAINFLOW_HOME: the CLI, its server, torchrun agents and
    workers (other tests' processes, on this worker or another, are not counted)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TRAINFLOW_HOME") == str(home) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found
