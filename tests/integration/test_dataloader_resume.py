"""An epoch-based job fed by a DataLoader over a DistributedSampler (shuffled, worker processes,
random augmentation, dropout, an epoch-stepped scheduler) resumes exactly from a mid-epoch
checkpoint: the run that fails over ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.conftest import job_processes, run_cli, summary_of, unique_prefix
from trainflow.backends.job_tmp import PREFIX as JOB_TMP_PREFIX

pytestmark = pytest.mark.integration

JOB = [
    "--set",
    "workload.entrypoint=tests/integration/workloads/dataloader_ddp.py",
    "--set",
    "workload.steps=30",
    "--set",
    "checkpoint.every_steps=10",
    "--set",
    "resources.nodes=1",
    "--set",
    "resources.procs_per_node=2",  # 6 batches an epoch per rank
    "--json",
]


def run(env: dict, stop_at_step: int, losses: Path) -> dict:
    args = f"workload.args=[--stop-at-step, '{stop_at_step}', --losses, '{losses}']"
    result = run_cli(
        ["run", "examples/digits/spec.yaml", "--set", args, "--set", f"checkpoint.uri={unique_prefix()}", *JOB],
        env,
        timeout_s=420,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return summary_of(result)


def last_losses(folder: Path) -> list[float]:
    return [float((folder / f"rank-{rank}.txt").read_text()) for rank in range(2)]


@pytest.mark.timeout(900)  # two runs, one of them failing over
def test_dataloader_job_resumes_exactly_from_a_mid_epoch_checkpoint(cli_env, tmp_path):
    (tmp_path / "uninterrupted").mkdir()
    (tmp_path / "resumed").mkdir()
    uninterrupted = run(cli_env, stop_at_step=0, losses=tmp_path / "uninterrupted")
    assert [a["outcome"] for a in uninterrupted["attempts"]] == ["SUCCEEDED"]
    # final_loss is the mean of the ranks' losses at the final step (their data differ, so do they)
    zero, one = last_losses(tmp_path / "uninterrupted")
    assert zero != one and uninterrupted["final_loss"] == (zero + one) / 2
    # step 15 is batch 3 of epoch 2; the first attempt commits it and exits
    resumed = run(cli_env, stop_at_step=15, losses=tmp_path / "resumed")
    attempts = resumed["attempts"]
    assert [a["outcome"] for a in attempts] == ["CRASHED", "SUCCEEDED"], attempts
    assert attempts[1]["resumed_from_step"] == 15
    assert resumed["final_step"] == 30
    assert resumed["params_sha256"] == uninterrupted["params_sha256"]
    assert last_losses(tmp_path / "resumed") == [zero, one] and resumed["final_loss"] == uninterrupted["final_loss"]


@pytest.fixture
def system_tmp():
    """A system temporary folder of the test's own (TMPDIR), short enough for Unix sockets in it."""
    path = Path(tempfile.mkdtemp(prefix="tf-tmp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(600)
def test_ranks_stopped_with_their_loader_workers_leave_no_temporary_files(cli_env, system_tmp):
    """Rank 1 dies; its agent stops rank 0 and its DataLoader workers, which get no chance to remove
    what multiprocessing made in TMPDIR: the job's own temporary folder, gone with the teardown."""
    result = run_cli(
        [
            "run",
            "examples/digits/spec.yaml",
            "--set",
            "workload.args=[--die-at-step, '5']",
            "--set",
            "fault_tolerance.max_restarts=0",
            "--set",
            f"checkpoint.uri={unique_prefix()}",
            *JOB,
        ],
        {**cli_env, "TMPDIR": str(system_tmp)},
        timeout_s=420,
    )
    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["CRASHED"], summary["attempts"]
    assert job_processes(summary["run_id"]) == []
    temp_dirs = [Path(p) for p in summary["teardown"]["removed_paths"] if Path(p).name.startswith(JOB_TMP_PREFIX)]
    assert len(temp_dirs) == 1 and temp_dirs[0].parent == system_tmp, summary["teardown"]
    assert list(system_tmp.iterdir()) == []  # neither the job's folder nor a multiprocessing one
