"""Real servers, one of each per session, for every test folder that needs them: a Prefect server
(its own PREFECT_HOME, SQLite) and an S3-compatible endpoint (moto) on loopback. A folder's
conftest imports the fixtures it uses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from trainflow.backends.ports import free_port
from trainflow.drills.servers import stop_server, wait_http

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
        env,
        home / "server.log",
        f"{api}/health",
        timeout_s=120,
    )
    yield api
    stop_server(proc)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory) -> str:
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    endpoint = f"http://127.0.0.1:{port}"
    proc = start_server(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        dict(os.environ),
        log,
        f"{endpoint}/moto-api/",
        timeout_s=60,
    )
    s3_env = s3_environment(endpoint)
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3_env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=s3_env["AWS_SECRET_ACCESS_KEY"],
    ).create_bucket(Bucket=BUCKET)
    yield endpoint
    stop_server(proc)


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
        "s3",
        endpoint_url=s3_endpoint,
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


@pytest.fixture
def cli_env(tmp_path, prefect_api, s3_endpoint) -> dict[str, str]:
    """Environment of a `trainflow` command: its own home, the session's Prefect server and S3."""
    env = {**os.environ, **s3_environment(s3_endpoint)}
    env.update({"TRAINFLOW_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api})
    env.pop("AWS_PROFILE", None)
    return env
