"""prefect.yaml's deployments on the session's Prefect server, and a real process worker running
them from this checkout: what `make deploy` and `prefect worker start` do for a person."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import psutil

from tests.conftest import ROOT
from tests.integration.conftest import BIN, stop_server

POOL = "trainflow-local"
FLOW = "training-lifecycle"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


# a busy server on SQLite answers "Service Unavailable" while its database is locked; Prefect's own
# client tries such calls again, and so does the UI's user
RETRIED_STATUSES = {429, 502, 503}
RETRY_WAITS_S = (0.5, 1, 2, 4, 8)


def api_call(api: str, method: str, path: str, body: dict | None = None):
    """(status, JSON) of one REST call, as the UI makes it."""
    for wait_s in (*RETRY_WAITS_S, None):
        request = urllib.request.Request(
            f"{api}{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            status, data = exc.code, json.loads(exc.read() or b"null")
        if status not in RETRIED_STATUSES or wait_s is None:
            return status, data
        time.sleep(wait_s)


def api_json(api: str, method: str, path: str, body: dict | None = None):
    status, data = api_call(api, method, path, body)
    assert status < 300, (method, path, status, data)
    return data


def prefect_env(api: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": api, **extra}


def deploy_all(api: str) -> None:
    """`make deploy`: the process work pool and `prefect deploy --all` from prefect.yaml."""
    result = subprocess.run(
        ["make", "--no-print-directory", "deploy", f"PREFECT_API_URL={api}"],
        cwd=ROOT,
        env=prefect_env(api),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"make deploy:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    # the nightly schedule stays as deployed, but must not start a run while the tests use the worker
    nightly = deployment(api, "train-nightly")
    api_json(api, "PATCH", f"/deployments/{nightly['id']}", {"paused": True})


def deployment(api: str, name: str, flow: str = FLOW) -> dict:
    return api_json(api, "GET", f"/deployments/name/{flow}/{name}")


@contextmanager
def process_worker(api: str, home: Path, log: Path):
    """`prefect worker start --pool trainflow-local` in the project root, TRAINFLOW_HOME set; stopped
    with everything it started."""
    env = prefect_env(
        api, TRAINFLOW_HOME=str(home), PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_SERVER_ANALYTICS_ENABLED="false"
    )
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--name", f"tests-{os.getpid()}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield worker
    finally:
        children = _descendants(worker.pid)
        stop_server(worker)
        for child in children:  # flow runs it started, should any outlive it
            try:
                child.kill()
            except psutil.Error:
                pass


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def create_flow_run(api: str, deployment_id: str, parameters: dict, name: str | None = None) -> dict:
    """What the UI's Run button does: a flow run of the deployment, scheduled now (named as the
    person named it in the form, or by the server)."""
    body = {"parameters": parameters, **({"name": name} if name else {})}
    return api_json(api, "POST", f"/deployments/{deployment_id}/create_flow_run", body)


def wait_for_flow_run(api: str, flow_run_id: str, timeout_s: float, worker: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        flow_run = api_json(api, "GET", f"/flow_runs/{flow_run_id}")
        if flow_run["state"]["type"] in TERMINAL:
            return flow_run
        assert worker.poll() is None, f"the worker exited:\n{log.read_text()[-4000:]}"
        time.sleep(1)
    raise AssertionError(f"flow run {flow_run_id} not finished after {timeout_s}s:\n{log.read_text()[-4000:]}")
