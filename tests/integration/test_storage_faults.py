"""Storage faults end a run the way a user can trust: a checkpoint folder that fills up or turns
read-only mid-run is an INFRA failure on the retry branch, never a crash of the lifecycle nor a
"succeeded" run whose last state lived only on the nodes; failed saves leave nothing behind; a
`--resume` whose chosen checkpoint disappears chooses again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import job_processes, run_cli, summary_of

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
WORKLOAD = "tests/integration/workloads/storage_fault.py"


@pytest.fixture
def tmpfs(tmp_path):
    """A 2 MiB tmpfs as the checkpoint folder (root only); unmounted whatever happens."""
    mountpoint = tmp_path / "store"
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mountpoint)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


def run_with_fault(cli_env: dict, tmp_path: Path, store: Path, fault: str, *extra: str):
    args = (f"[--store, '{store}', --fault, {fault}, --at-step, '25', --after-commit, '20', "
            f"--marker, '{tmp_path / 'faulted'}', {', '.join(extra)}]").replace(", ]", "]")
    return run_cli([
        "run", SPEC, "--set", f"workload.entrypoint={WORKLOAD}", "--set", f"workload.args={args}",
        "--set", "workload.steps=40", "--set", "checkpoint.every_steps=10", "--set", "checkpoint.keep_last=2",
        "--set", "checkpoint.snapshot_every_s=0", "--set", f"checkpoint.uri={store}", "--json",
    ], cli_env)


def uncommitted_folders(store: Path, run_id: str) -> list[str]:
    run = store / run_id
    return sorted(p.name for p in run.glob("step-*") if not (p / "manifest.json").exists()) if run.is_dir() else []


def test_a_full_checkpoint_folder_never_ends_in_success_with_the_last_state_only_on_the_nodes(
        cli_env, tmp_path, tmpfs):
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


def test_the_last_state_restored_from_a_node_is_made_durable_before_the_run_succeeds(cli_env, tmp_path, tmpfs):
    result = run_with_fault(cli_env, tmp_path, tmpfs, "full", "--free-on-attempt", "'2'")
    summary = summary_of(result)
    assert result.returncode == 0, result.stderr[-4000:]
    assert [a["outcome"] for a in summary["attempts"]] == ["INFRA", "SUCCEEDED"]
    assert summary["attempts"][1]["resumed_from_step"] == 40
    assert summary["checkpoints"][-1]["step"] == 40 and summary["checkpoints"][-1]["verified"]
    assert uncommitted_folders(tmpfs, summary["run_id"]) == []


def test_a_checkpoint_folder_turning_read_only_is_infra_and_the_run_ends_with_its_summary(
        cli_env, tmp_path, tmpfs):
    result = run_with_fault(cli_env, tmp_path, tmpfs, "read-only")
    summary = summary_of(result)  # the JSON summary, not a traceback
    assert result.returncode == 1, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    assert summary["status"] == "failed"
    assert {a["outcome"] for a in summary["attempts"]} == {"INFRA"}
    assert "Read-only file system" in summary["reason"]
    assert {10, 20} <= {c["step"] for c in summary["checkpoints"] if c["verified"]}
    assert summary["teardown"]["clean"] is True and job_processes(summary["run_id"]) == []


def test_resume_whose_chosen_checkpoint_disappeared_chooses_again(cli_env, tmp_path):
    store = tmp_path / "shared-store"
    workload = ["--set", "workload.entrypoint=tests/integration/workloads/lose_restore_point.py"]
    common = [*workload, "--set", "checkpoint.every_steps=10", "--set", f"checkpoint.uri={store}",
              "--set", "checkpoint.snapshot_every_s=0", "--json"]
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
