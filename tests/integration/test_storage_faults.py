"""Storage faults end a run the way a user can trust: a checkpoint folder that fills up or turns
read-only mid-run is an INFRA failure on the retry branch, never a crash of the lifecycle nor a
"succeeded" run whose last state lived only on the nodes; failed saves leave nothing behind; an
S3 endpoint that stops answering is a storage outage (INFRA), not a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import boto3
import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import (
    BIN,
    BUCKET,
    attempt_runs,
    job_processes,
    run_cli,
    s3_environment,
    start_server,
    stop_server,
    summary_of,
)
from trainflow.backends.ports import free_port
from trainflow.backends.rank_records import read_ranks

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
WORKLOAD = "tests/integration/workloads/storage_fault.py"


@pytest.fixture
def tmpfs(tmp_path):
    """A 2 MiB tmpfs as the checkpoint folder (root only); unmounted whatever happens."""
    mountpoint = tmp_path / "store"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mountpoint)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


def run_with_fault(cli_env: dict, tmp_path: Path, store: Path, fault: str, *extra: str):
    args = (
        f"[--store, '{store}', --fault, {fault}, --at-step, '25', --after-commit, '20', "
        f"--marker, '{tmp_path / 'faulted'}', {', '.join(extra)}]"
    ).replace(", ]", "]")
    return run_cli(
        [
            "run",
            SPEC,
            "--set",
            f"workload.entrypoint={WORKLOAD}",
            "--set",
            f"workload.args={args}",
            "--set",
            "workload.steps=40",
            "--set",
            "checkpoint.every_steps=10",
            "--set",
            "checkpoint.keep_last=2",
            "--set",
            "checkpoint.snapshot_every_s=0",
            "--set",
            f"checkpoint.uri={store}",
            "--json",
        ],
        cli_env,
    )


def uncommitted_folders(store: Path, run_id: str) -> list[str]:
    run = store / run_id
    return sorted(p.name for p in run.glob("step-*") if not (p / "manifest.json").exists()) if run.is_dir() else []


def test_a_full_checkpoint_folder_never_ends_in_success_with_the_last_state_only_on_the_nodes(cli_env, tmp_path, tmpfs):
    result = run_with_fault(cli_env, tmp_path, tmpfs, "full")
    summary = summary_of(result)
    assert result.returncode == 1, result.stderr[-4000:]
    assert summary["status"] == "failed"
    outcomes = [a["outcome"] for a in summary["attempts"]]
    assert set(outcomes) == {"INFRA"} and len(outcomes) >= 2, summary["attempts"]
    # the second attempt restored the last step from a node-local copy and had nothing to train:
    # it still had to put that state in the store, and could not
    assert summary["attempts"][1]["resumed_from_step"] == 40
    assert "No space left on device" in summary["reason"]
    assert [c["step"] for c in summary["checkpoints"]] == [10, 20]
    assert uncommitted_folders(tmpfs, summary["run_id"]) == []  # failed saves removed their files
    assert summary["teardown"]["clean"] is True and job_processes(summary["run_id"]) == []
    # step 40 exists only on the nodes: teardown moved it out of the scratch it removes, every node's part
    kept = [Path(p) for p in summary["teardown"]["kept_paths"]]
    assert {p.parent.name for p in kept} == {"node-0", "node-1"}
    assert all("step-00000040" in p.name and (p / "manifest.json").is_file() for p in kept)


def test_the_last_state_restored_from_a_node_is_made_durable_before_the_run_succeeds(cli_env, tmp_path, tmpfs):
    result = run_with_fault(cli_env, tmp_path, tmpfs, "full", "--free-on-attempt", "'2'")
    summary = summary_of(result)
    assert result.returncode == 0, result.stderr[-4000:]
    outcomes = [a["outcome"] for a in summary["attempts"]]
    assert outcomes[0] == "INFRA" and "INFRA" not in outcomes[1:] and outcomes[-1] == "SUCCEEDED", outcomes
    assert summary["attempts"][1]["resumed_from_step"] == 40
    assert summary["checkpoints"][-1]["step"] == 40 and summary["checkpoints"][-1]["verified"]
    assert uncommitted_folders(tmpfs, summary["run_id"]) == []


def test_a_checkpoint_folder_turning_read_only_is_infra_and_the_run_ends_with_its_summary(cli_env, tmp_path, tmpfs):
    result = run_with_fault(cli_env, tmp_path, tmpfs, "read-only")
    summary = summary_of(result)  # the JSON summary, not a traceback
    assert result.returncode == 1, result.stderr[-4000:]
    # the orchestrator's own output has no traceback; the failing rank's last stderr lines (its
    # StorageError, with the worker's own traceback) are quoted on purpose, prefixed by torch with [rankN]
    assert not [line for line in result.stderr.splitlines() if line.startswith("Traceback")]
    assert summary["status"] == "failed"
    assert {a["outcome"] for a in summary["attempts"]} == {"INFRA"}
    assert "Read-only file system" in summary["reason"]
    assert {10, 20} <= {c["step"] for c in summary["checkpoints"] if c["verified"]}
    assert summary["teardown"]["clean"] is True and job_processes(summary["run_id"]) == []


@pytest.fixture
def own_s3(tmp_path):
    """An S3 endpoint of this test's own, since the test freezes it."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = start_server(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        dict(os.environ),
        tmp_path / "moto.log",
        f"{endpoint}/moto-api/",
        timeout_s=60,
    )
    try:
        env = s3_environment(endpoint)
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=env["AWS_DEFAULT_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        ).create_bucket(Bucket=BUCKET)
        yield proc, env
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        stop_server(proc)


def resume_once_the_attempt_is_gone(home: Path, server: subprocess.Popen, done: threading.Event) -> None:
    """SIGCONT the frozen endpoint once the first attempt's ranks have been stopped (the nodes'
    standby interpreters stay for the next attempt)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not done.is_set():
        ranks = [pid for path in home.glob("runs/*/attempt-1/node-*.ranks") for pid in read_ranks(path).values()]
        if len(ranks) == 2 and not any(running(pid) for pid in ranks):
            break
        time.sleep(0.5)
    os.kill(server.pid, signal.SIGCONT)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def first_attempt_evidence(summary: dict, folder: Path) -> dict:
    client = MlflowClient(summary["tracking_uri"])
    first = attempt_runs(client, summary)[0]
    return json.loads(Path(client.download_artifacts(first.info.run_id, "evidence.json", str(folder))).read_text())


@pytest.mark.timeout(600)
def test_an_s3_outage_longer_than_the_hang_timeout_is_infra_not_a_hang(cli_env, tmp_path, own_s3):
    server, s3_env = own_s3
    env = {**cli_env, **s3_env}
    done = threading.Event()
    resumer = threading.Thread(
        target=resume_once_the_attempt_is_gone, args=(Path(env["TRAINFLOW_HOME"]), server, done), daemon=True
    )
    resumer.start()
    # frozen before the first checkpoint: the workers' first upload blocks, and the orchestrator,
    # with no commit to verify, is not itself waiting on the endpoint while it ends the attempt
    args = f"[--pid, '{server.pid}', --at-step, '5', --marker, '{tmp_path / 'frozen'}']"
    try:
        result = run_cli(
            [
                "run",
                SPEC,
                "--set",
                "workload.entrypoint=tests/integration/workloads/signal_at_step.py",
                "--set",
                f"workload.args={args}",
                "--set",
                "workload.steps=60",
                "--set",
                "checkpoint.every_steps=10",
                "--set",
                "checkpoint.snapshot_every_s=0",
                "--set",
                f"checkpoint.uri=s3://{BUCKET}/outage",
                "--set",
                "fault_tolerance.hang_timeout_s=10",
                "--json",
            ],
            env,
            timeout_s=600,
        )
    finally:
        done.set()
        resumer.join(10)
    summary = summary_of(result)
    assert result.returncode == 0, result.stderr[-4000:]
    # the frozen endpoint ended the first attempt as a storage outage, and the run went on
    assert [a["outcome"] for a in summary["attempts"]] == ["INFRA", "SUCCEEDED"], result.stderr[-4000:]
    evidence = first_attempt_evidence(summary, tmp_path)
    assert "blocked in storage calls" in evidence["reason"] and "checkpoint save of step" in evidence["reason"]
    assert evidence["storage_calls"]
    assert summary["final_step"] == 60 and summary["checkpoints"][-1]["step"] == 60


def test_resume_whose_chosen_checkpoint_disappeared_chooses_again(cli_env, tmp_path):
    store = tmp_path / "shared-store"
    workload = ["--set", "workload.entrypoint=tests/integration/workloads/lose_restore_point.py"]
    common = [
        *workload,
        "--set",
        "checkpoint.every_steps=10",
        "--set",
        f"checkpoint.uri={store}",
        "--set",
        "checkpoint.snapshot_every_s=0",
        "--json",
    ]
    runs = [run_cli(["run", SPEC, "--set", f"workload.steps={steps}", *common], cli_env) for steps in (20, 30)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:] + runs[1].stderr[-3000:]
    older, newer = (summary_of(r) for r in runs)

    # --resume chooses the newer run's step 30; the first attempt finds that run deleted
    result = run_cli(["run", SPEC, "--resume", "--set", "workload.steps=40", *common], cli_env)
    summary = summary_of(result)
    assert result.returncode == 0, result.stderr[-4000:]
    assert not (store / newer["run_id"]).exists()
    outcomes = [a["outcome"] for a in summary["attempts"]]
    assert outcomes[0] == "INFRA" and "INFRA" not in outcomes[1:] and outcomes[-1] == "SUCCEEDED", outcomes
    # chosen again: the older run's step 20, the newest verified checkpoint left
    assert summary["attempts"][1]["resumed_from_step"] == 20
    assert summary["final_step"] == 40
