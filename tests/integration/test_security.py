"""A second local user cannot read a run's token, a forged `finished` cannot end a run succeeded,
and a secret handed to the workers through `workload.secret_env` is recorded nowhere.

One run of a job that reads a secret, pauses at a step while the test looks at it as user
`nobody` and sends forged reports with the token (as a thief of it would), then exits 0 without
finishing. Runs as root (the tests do) with `runuser`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import BIN, job_processes, summary_of

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser"),
]

SPEC = "examples/digits/spec.yaml"
SECRET_NAME = "TRAINFLOW_TEST_SECRET"
FORGED_HASH = "f" * 64
PAUSE_AT = 5


def wait_until(condition, what: str, timeout_s: float = 180.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc is not None and proc.poll() is not None:
            output = proc.stdout.read()[-3000:] + "\n" + proc.stderr.read()[-3000:]
            raise AssertionError(f"the run ended before {what}:\n{output}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.1)


def as_nobody(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "nobody", "--", *command], capture_output=True, text=True, timeout=30)


def forge(address: str, token: str, identity: dict, *messages: dict) -> None:
    """What a holder of the token could send: a hello as `identity`, then `messages`."""
    host, _, port = address.rpartition(":")
    lines = [{"kind": "hello", "token": token, **identity, "t": time.time()}]
    lines += [{**identity, "t": time.time(), **m} for m in messages]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


def files_containing(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
            found.append(str(path))
    return found


def api(prefect_api: str, method: str, path: str, body: dict | None = None):
    request = urllib.request.Request(
        f"{prefect_api}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def logs_of(prefect_api: str, flow_run_id: str) -> list[dict]:
    logs: list[dict] = []
    while True:
        page = api(
            prefect_api,
            "POST",
            "/logs/filter",
            {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200, "offset": len(logs)},
        )
        logs += page
        if len(page) < 200:
            return logs


@pytest.fixture(scope="module")
def paused_run(tmp_path_factory, prefect_api):
    """The run, observed while it was paused and after it ended."""
    home = tmp_path_factory.mktemp("home")
    shared = tmp_path_factory.mktemp("shared")
    shared.chmod(0o777)  # the workload's own output folder; nothing of trainflow's
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    env = {**os.environ, "TRAINFLOW_HOME": str(home), "PREFECT_API_URL": prefect_api, SECRET_NAME: secret}
    args = ["--secret-name", SECRET_NAME, "--pause-at-step", str(PAUSE_AT), "--dir", str(shared)]
    command = [
        str(BIN / "trainflow"),
        "run",
        SPEC,
        "--set",
        "workload.entrypoint=tests/integration/workloads/secret_then_pause.py",
        "--set",
        f"workload.args={json.dumps(args)}",
        "--set",
        f"workload.secret_env=[{SECRET_NAME}]",
        "--set",
        "workload.steps=50",
        "--set",
        "checkpoint.every_steps=50",
        "--set",
        "fault_tolerance.hang_timeout_s=600",
        "--set",
        "fault_tolerance.max_user_errors=0",
        "--json",
    ]
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict = {}
    try:
        wait_until(lambda: all((shared / f"paused-{r}").exists() for r in (0, 1)), "both ranks pause", proc=proc)
        config_path = next(home.glob("runs/*/attempt-1/node-0.json"))
        run_dir = config_path.parent.parent
        config = json.loads(config_path.read_text())
        seen["modes"] = {
            str(p.relative_to(home)): (p.is_dir(), stat.S_IMODE(p.stat().st_mode))
            for p in [run_dir, config_path.parent, *run_dir.glob("node-*"), *run_dir.glob("attempt-1/node-*")]
        }
        seen["nobody_cat"] = as_nobody("cat", str(config_path))
        seen["nobody_ls"] = as_nobody("ls", str(run_dir))
        seen["run_dir_with_secret"] = files_containing(run_dir, secret.encode())
        seen["run_dir_with_token_outside_configs"] = [
            f for f in files_containing(run_dir, config["status_token"].encode()) if not f.endswith(".json")
        ]
        address, token = config["status_address"], config["status_token"]
        # another rank's connection claiming rank 0; a rank outside the world; a second process as rank 0
        forge(
            address,
            token,
            {"rank": 1, "node": 1, "attempt": 1, "pid": 1},
            {"kind": "finished", "rank": 0, "node": 0, "step": PAUSE_AT, "params_sha256": FORGED_HASH, "loss": 0.0},
        )
        forge(
            address,
            token,
            {"rank": 7, "node": 0, "attempt": 1, "pid": 7},
            {"kind": "finished", "step": PAUSE_AT, "params_sha256": FORGED_HASH, "loss": 0.0},
        )
        for rank in (0, 1):
            forge(
                address,
                token,
                {"rank": rank, "node": rank, "attempt": 1, "pid": 4242 + rank},
                {"kind": "finished", "step": PAUSE_AT, "params_sha256": FORGED_HASH, "loss": 0.0},
            )
        (shared / "release").touch()
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    result = subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
    seen.update(result=result, summary=summary_of(result), secret=secret, home=home, shared=shared, run_dir=run_dir)
    return seen


def test_a_second_user_cannot_read_the_token(paused_run):
    modes = paused_run["modes"]
    folders = {path: mode for path, (is_dir, mode) in modes.items() if is_dir}
    files = {path: mode for path, (is_dir, mode) in modes.items() if not is_dir}
    # the run, its attempt, both node scratches; the nodes' configs, logs and rank records
    assert len(folders) >= 4 and len(files) >= 6, modes
    assert set(folders.values()) == {0o700}, folders
    assert set(files.values()) == {0o600}, files
    for denied in (paused_run["nobody_cat"], paused_run["nobody_ls"]):
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
    assert paused_run["run_dir_with_token_outside_configs"] == []


def test_forged_finished_reports_do_not_end_the_run_succeeded(paused_run):
    result, summary = paused_run["result"], paused_run["summary"]
    assert result.returncode == 1, result.stderr[-4000:]
    assert summary["status"] == "failed"
    assert [a["outcome"] for a in summary["attempts"]] == ["USER_ERROR"]
    assert "without finishing" in summary["reason"]
    assert summary["params_sha256"] != FORGED_HASH
    assert FORGED_HASH not in result.stdout
    assert summary["teardown"]["clean"] is True and job_processes(summary["run_id"]) == []


def test_a_secret_env_reaches_the_workers_and_is_recorded_nowhere(paused_run, prefect_api):
    secret = paused_run["secret"]
    expected = hashlib.sha256(secret.encode()).hexdigest()
    assert [(paused_run["shared"] / f"rank-{r}.sha256").read_text() for r in (0, 1)] == [expected, expected]
    # not in the run folder while it ran, nor anywhere under the home since (MLflow's database and
    # artifacts, checkpoints), nor in what the command printed
    assert paused_run["run_dir_with_secret"] == []
    assert files_containing(paused_run["home"], secret.encode()) == []
    assert (paused_run["home"] / "mlflow.db").exists()
    result = paused_run["result"]
    assert secret not in result.stdout and secret not in result.stderr
    # nor in Prefect: the flow run's parameters (which do name the variable), task runs, logs, artifacts
    flow_run_id = paused_run["summary"]["prefect_flow_run_id"]
    flow_run = api(prefect_api, "GET", f"/flow_runs/{flow_run_id}")
    assert SECRET_NAME in json.dumps(flow_run["parameters"])
    by_flow_run = {"flow_runs": {"id": {"any_": [flow_run_id]}}}
    recorded = [
        flow_run,
        api(prefect_api, "POST", "/task_runs/filter", {**by_flow_run, "limit": 200}),
        logs_of(prefect_api, flow_run_id),
        api(prefect_api, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}),
    ]
    assert recorded[2], "the flow run logged nothing: the scan would prove nothing"
    assert secret not in json.dumps(recorded)
