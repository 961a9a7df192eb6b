"""Plain torchrun scripts (`workload.mode: plain`) with real torchrun workers: a crash after the
start-up window is retried like torchrun would, a rank killed by a signal is KILLED naming it, and
a script that checkpoints on its own (nanoGPT's way) resumes from its checkpoint, which trainflow
copies to the checkpoint store and restores on every node, also after the node's folder is gone."""

from __future__ import annotations

import pytest

from tests.integration.conftest import job_processes, run_cli, summary_of

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
PLAIN = [
    "--set", "workload.entrypoint=tests/integration/workloads/plain_nanogpt.py",
    "--set", "workload.mode=plain",
    "--set", "fault_tolerance.plain_startup_window_s=1",
]


def plain_args(out_dir, marker, *extra: str) -> list[str]:
    # past the start-up window by construction: the failing rank waits until its process is 2 s old
    args = ["--out_dir", str(out_dir), "--max_iters", "60", "--ckpt_every", "10", "--fail-once", str(marker),
            "--fail-at-iter", "30", "--fail-not-before-s", "2", *extra]
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
