"""Plain torchrun scripts (`workload.mode: plain`) with real torchrun workers: a crash after the
start-up window is retried like torchrun would, a rank killed by a signal is KILLED naming it, and
a script that checkpoints on its own (nanoGPT's way) resumes from its checkpoint, which trainflow
copies to the checkpoint store and restores on every node, also after the node's folder is gone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integration.conftest import job_processes, run_cli, summary_of, unique_prefix
from trainflow.checkpoint.catalog import latest_verified
from trainflow.checkpoint.storage import open_storage

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
PLAIN = [
    "--set",
    "workload.entrypoint=tests/integration/workloads/plain_nanogpt.py",
    "--set",
    "workload.mode=plain",
    "--set",
    "fault_tolerance.plain_startup_window_s=1",
]


def plain_args(out_dir, marker, *extra: str) -> list[str]:
    # past the start-up window by construction: the failing rank waits until its process is 2 s old
    args = [
        "--out_dir",
        str(out_dir),
        "--max_iters",
        "60",
        "--ckpt_every",
        "10",
        "--fail-once",
        str(marker),
        "--fail-at-iter",
        "30",
        "--fail-not-before-s",
        "2",
        *extra,
    ]
    return ["--set", "workload.args=[" + ", ".join(f"'{a}'" for a in args) + "]"]


def test_a_plain_script_that_crashes_mid_run_is_retried_with_its_exception_as_the_reason(cli_env, tmp_path):
    result = run_cli(["run", SPEC, *PLAIN, *plain_args(tmp_path / "out", tmp_path / "failed"), "--json"], cli_env)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    attempts = summary["attempts"]
    assert [a["outcome"] for a in attempts] == ["CRASHED", "SUCCEEDED"], [a["reason"] for a in attempts]
    assert "rank 0 on node 0 exited with code 1" in attempts[0]["reason"]
    assert "failing at iteration 30" not in attempts[0]["reason"]  # a line of its stderr, not an error
    assert job_processes(summary["run_id"]) == []


def test_a_plain_rank_killed_by_a_signal_is_killed_and_the_signal_named(cli_env, tmp_path):
    args = plain_args(tmp_path / "out", tmp_path / "failed", "--fail-signal", "SIGKILL", "--fail-rank", "1")
    result = run_cli(["run", SPEC, *PLAIN, *args, "--json"], cli_env)
    assert result.returncode == 0, result.stderr[-4000:]
    attempts = summary_of(result)["attempts"]
    assert [a["outcome"] for a in attempts] == ["KILLED", "SUCCEEDED"], [a["reason"] for a in attempts]
    assert "rank 1 on node 1 was killed by SIGKILL" in attempts[0]["reason"]


def own_checkpoints(out_dir, store: str) -> list[str]:
    return [
        "--set",
        f"workload.plain.checkpoint_dir={out_dir}",
        "--set",
        "workload.plain.resume_args=[--init_from=resume]",
        "--set",
        f"checkpoint.uri={store}",
    ]


def checkpoint_at(storage, prefix: str, tmp_path) -> dict:
    local = tmp_path / prefix.replace("/", "-") / "ckpt.pt"
    storage.download(f"{prefix}/ckpt.pt", local)
    return torch.load(local, weights_only=True)


@pytest.mark.parametrize(
    "store, failure",
    [
        ("local", ["--remove-out"]),  # the node's folder is gone: only the copy in the store is left
        ("s3", ["--fail-signal", "SIGKILL"]),
    ],
)
def test_a_plain_script_resumes_from_its_own_checkpoint_copied_to_the_store(
    cli_env, tmp_path, monkeypatch, store, failure
):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(name, cli_env[name])  # this test reads the store too
    uri = str(tmp_path / "store") if store == "local" else unique_prefix()
    out = tmp_path / "out"
    args = plain_args(out, tmp_path / "failed", "--fail-once-copied-to", uri, *failure)
    result = run_cli(["run", SPEC, *PLAIN, *args, *own_checkpoints(out, uri), "--json"], cli_env)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    attempts = summary["attempts"]
    expected = "KILLED" if "SIGKILL" in failure else "CRASHED"
    assert [a["outcome"] for a in attempts] == [expected, "SUCCEEDED"], [a["reason"] for a in attempts]
    assert attempts[0]["resumed_from"] is None
    restored = attempts[1]["resumed_from"]
    assert restored and restored.startswith(f"{uri}/{summary['run_id']}/step-"), attempts[1]
    storage = open_storage(uri)
    resumed_at = checkpoint_at(storage, restored.removeprefix(f"{uri}/"), tmp_path)["iter_num"]
    assert 10 <= resumed_at <= 30
    final = latest_verified(storage, summary["run_id"])  # the copy taken once every rank exited 0
    last = checkpoint_at(storage, final.prefix, tmp_path)
    assert last["iter_num"] == 60 and last["starts"] == [[1, 0], [2, resumed_at]], last["starts"]
    assert summary["checkpoints"] and all(c["verified"] for c in summary["checkpoints"]), summary["checkpoints"]
    assert len(storage.list(summary["run_id"])) <= 3 * 2 + 2  # retention (keep_last 3), two restore records
    assert job_processes(summary["run_id"]) == []


@pytest.mark.parametrize(
    ("fault", "detected"),
    [
        ("kill", "KILLED"),
        ("corrupt-checkpoint", "KILLED"),
        ("preempt", "PREEMPTED"),
        ("node-loss", "NODE_LOST"),  # seen by its relay's silence: the script itself reports nothing
    ],
)
def test_a_drill_at_a_time_on_a_plain_script_passes(cli_env, tmp_path, fault, detected):
    # 400 iterations of at least 50 ms: the job runs well past the fault's time, whatever the load
    out = tmp_path / "out"
    args = ["--out_dir", str(out), "--max_iters", "400", "--ckpt_every", "40", "--iter_sleep_s", "0.05"]
    result = run_cli(
        [
            "drill",
            SPEC,
            "--fault",
            fault,
            "--at-s",
            "6",
            "--no-compare-torchrun",
            *PLAIN,
            "--set",
            "workload.args=[" + ", ".join(f"'{a}'" for a in args) + "]",
            *own_checkpoints(out, str(tmp_path / "store")),
            "--json",
        ],
        cli_env,
        timeout_s=400,
    )
    report = summary_of(result)
    assert report["outcomes"] == [detected, "SUCCEEDED"], report
    assert report["injected"] is True and report["injected_at_s"] >= 6, report
    if report["newest_copy_before_fault"]:
        assert report["resumed_from"] and report["resumed_from"] != report["damaged"], report
    assert report["broken_rules"] == [] and report["passed"] is True and result.returncode == 0, report


@pytest.mark.parametrize(
    ("drill", "refusal"),
    [
        (["--fault", "hang", "--at-s", "5"], "--fault hang: a plain script reports no progress"),
        (["--fault", "crash", "--at-step", "30"], "--at-s: a plain script reports no steps"),
    ],
)
def test_a_drill_that_cannot_apply_to_a_plain_script_is_refused_before_anything_runs(cli_env, drill, refusal):
    result = run_cli(["drill", SPEC, *drill, *PLAIN], cli_env, timeout_s=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert refusal in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (Path(cli_env["TRAINFLOW_HOME"]) / "runs").exists()  # nothing provisioned
