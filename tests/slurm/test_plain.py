"""A plain torchrun script on a real Slurm cluster: a crash after its start-up window is retried in a
new job, and the script resumes from its own checkpoint, which node 0's agent copied to the store
and the retry restored after the folder was gone."""

from __future__ import annotations

import pytest
import torch

from tests.integration.conftest import job_processes, run_cli, summary_of
from tests.slurm.test_lifecycle import ON_SLURM, SPEC
from trainflow.checkpoint.catalog import latest_verified
from trainflow.checkpoint.storage import open_storage

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.timeout(600)]


def test_a_plain_script_on_slurm_resumes_from_its_own_checkpoint_after_a_crash(slurm_env, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    # past the start-up window by construction: the failing rank waits until its process is 2 s old,
    # and until a copy of its checkpoint is in the store; then its folder goes, as a node's would
    script = [
        *("--out_dir", str(out), "--max_iters", "60", "--ckpt_every", "10"),
        *("--fail-once", str(tmp_path / "failed"), "--fail-at-iter", "30", "--fail-not-before-s", "2"),
        *("--fail-once-copied-to", str(store), "--remove-out"),
    ]
    result = run_cli(
        [
            "run",
            SPEC,
            *ON_SLURM,
            "--set",
            "workload.entrypoint=tests/integration/workloads/plain_nanogpt.py",
            "--set",
            "workload.mode=plain",
            "--set",
            "fault_tolerance.plain_startup_window_s=1",
            "--set",
            "workload.args=[" + ", ".join(f"'{a}'" for a in script) + "]",
            "--set",
            f"workload.plain.checkpoint_dir={out}",
            "--set",
            "workload.plain.resume_args=[--init_from=resume]",
            "--set",
            f"checkpoint.uri={store}",
            "--json",
        ],
        slurm_env,
        timeout_s=400,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    attempts = summary["attempts"]
    assert [a["outcome"] for a in attempts] == ["CRASHED", "SUCCEEDED"], [a["reason"] for a in attempts]
    assert "rank 0 on node 0 exited with code 1" in attempts[0]["reason"], attempts[0]["reason"]
    restored = attempts[1]["resumed_from"]
    assert restored and restored.startswith(f"{store}/{summary['run_id']}/step-"), attempts[1]

    storage = open_storage(str(store))
    resumed_at = _checkpoint(storage, restored.removeprefix(f"{store}/"), tmp_path)["iter_num"]
    assert 10 <= resumed_at <= 30
    last = _checkpoint(storage, latest_verified(storage, summary["run_id"]).prefix, tmp_path)
    assert last["iter_num"] == 60 and last["starts"] == [[1, 0], [2, resumed_at]], last["starts"]
    assert job_processes(summary["run_id"]) == []


def _checkpoint(storage, prefix: str, tmp_path) -> dict:
    local = tmp_path / prefix.replace("/", "-") / "ckpt.pt"
    storage.download(f"{prefix}/ckpt.pt", local)
    return torch.load(local, weights_only=True)
