"""A plain torchrun script on a real Slurm cluster: a crash after its start-up window is retried in a
new job, and the script resumes from its own checkpoint, which node 0's agent copied to the store
and the retry restored after the folder was gone."""

from __future__ import annotations

import pytest

from tests.integration.conftest import job_processes, run_cli, summary_of
from tests.integration.test_plain_scripts import PLAIN, checkpoint_at, own_checkpoints, plain_args
from tests.slurm.test_lifecycle import ON_SLURM, SPEC
from trainflow.checkpoint.catalog import latest_verified
from trainflow.checkpoint.storage import open_storage

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.timeout(600)]


def test_a_plain_script_on_slurm_resumes_from_its_own_checkpoint_after_a_crash(slurm_env, tmp_path):
    out, store = tmp_path / "out", str(tmp_path / "store")
    # once a copy of its checkpoint is in the store, the script's folder goes, as a node's would
    args = plain_args(out, tmp_path / "failed", "--fail-once-copied-to", store, "--remove-out")
    result = run_cli(
        ["run", SPEC, *ON_SLURM, *PLAIN, *args, *own_checkpoints(out, store), "--json"], slurm_env, timeout_s=400
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    attempts = summary["attempts"]
    assert [a["outcome"] for a in attempts] == ["CRASHED", "SUCCEEDED"], [a["reason"] for a in attempts]
    assert "rank 0 on node 0 exited with code 1" in attempts[0]["reason"], attempts[0]["reason"]
    restored = attempts[1]["resumed_from"]
    assert restored and restored.startswith(f"{store}/{summary['run_id']}/step-"), attempts[1]

    storage = open_storage(store)
    resumed_at = checkpoint_at(storage, restored.removeprefix(f"{store}/"), tmp_path)["iter_num"]
    assert 10 <= resumed_at <= 30
    last = checkpoint_at(storage, latest_verified(storage, summary["run_id"]).prefix, tmp_path)
    assert last["iter_num"] == 60 and last["starts"] == [[1, 0], [2, resumed_at]], last["starts"]
    assert job_processes(summary["run_id"]) == []
