"""Real servers for the integration tests, one of each per session: a Prefect server (its own
PREFECT_HOME, SQLite) and an S3-compatible endpoint (moto) on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import boto3
import psutil
import pytest

from tests.conftest import ROOT
from trainflow.backends.ports import free_port
from trainflow.backends.stacks import py_spy_dump
from trainflow.drills.servers import stop_server, wait_http
from trainflow.worker_config import JOB_ENV

BIN = Path(sys.executable).parent
BUCKET = "trainflow-tests"


def start_server(cmd: list[str], env: dict, log: Path, health: str, timeout_s: float) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(health, proc, timeout_s, log)
    except Exception:
        stop_server(proc)
        raise
    return proc


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory) -> str:
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
    }
    env.pop("PREFECT_API_URL", None)
    api = f"http://127.0.0.1:{port}/api"
    proc = start_server(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env, home / "server.log", f"{api}/health", timeout_s=120,
    )
    yield api
    stop_server(proc)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory) -> str:
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    endpoint = f"http://127.0.0.1:{port}"
    proc = start_server(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], dict(os.environ), log,
        f"{endpoint}/moto-api/", timeout_s=60,
    )
    s3_env = s3_environment(endpoint)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id=s3_env["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=s3_env["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket=BUCKET)
    yield endpoint
    stop_server(proc)


@pytest.fixture(scope="session")
def finished_runs(tmp_path_factory, prefect_api, s3_endpoint):
    """Finished real runs that several modules only read (tests/integration/finished_runs.py), made once."""
    from tests.integration.finished_runs import make_finished_runs  # it imports this module's helpers

    return make_finished_runs(tmp_path_factory.mktemp("finished-runs"), prefect_api, s3_endpoint)


def s3_environment(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "trainflow-test-key",
        "AWS_SECRET_ACCESS_KEY": "trainflow-test-secret-do-not-log",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@pytest.fixture
def s3(s3_endpoint):
    env = s3_environment(s3_endpoint)
    return boto3.client(
        "s3", endpoint_url=s3_endpoint, region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


@pytest.fixture
def cli_env(tmp_path, prefect_api, s3_endpoint) -> dict[str, str]:
    """Environment of a `trainflow` command: its own home, the session's Prefect server and S3."""
    env = {**os.environ, **s3_environment(s3_endpoint)}
    env.update({"TRAINFLOW_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api})
    env.pop("AWS_PROFILE", None)
    return env


def unique_prefix() -> str:
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:8]}"


def run_cli(args: list[str], env: dict, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """A `trainflow` command run to its end. One still running after `timeout_s` fails the test with
    its stderr's tail and the stacks of it and every process under it, all of which are then ended."""
    command = [str(BIN / "trainflow"), *args]
    with subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
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
            pytest.fail(f"trainflow {' '.join(args[:2])} still running after {timeout_s:g} s\n"
                        f"stderr (tail):\n{stderr[-6000:]}\n{stacks}")
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
        raise AssertionError(f"last stdout line is not JSON:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


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


def trainflow_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if JOB_ENV in proc.environ() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found
