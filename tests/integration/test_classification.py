"""Outcomes a team can trust, with real torchrun workers: a script error at start-up is the user's
and quotes the script's own error line; a segfault whose node-mate reports a peer error is a crash
of that rank; plain torchrun scripts run, fail with their own exception, may start slowly, and a
rank that never exits after its peers finished is a hang of that rank, with its stacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import attempt_runs, job_processes, run_cli, summary_of, unique_prefix

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
ARG_ERROR = "argument --hidden: invalid int value: 'notanumber'"
PLAIN = [
    "--set",
    "workload.entrypoint=tests/integration/workloads/plain_ddp.py",
    "--set",
    "workload.mode=plain",
]


def test_a_script_error_at_start_up_is_a_user_error_that_quotes_the_script(cli_env):
    result = run_cli(["run", SPEC, "--set", "workload.args=[--hidden, notanumber]", "--json"], cli_env)
    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["USER_ERROR"]  # not retried
    assert ARG_ERROR in summary["reason"]
    assert ARG_ERROR in result.stdout.split("reason:")[1].splitlines()[0]  # the CLI summary's reason line
    assert ARG_ERROR in result.stderr  # the Prefect log (the watch task's warning)
    client = MlflowClient(summary["tracking_uri"])
    assert ARG_ERROR in client.get_run(summary["mlflow_run_id"]).data.tags["reason"]
    child = attempt_runs(client, summary)[0]
    assert ARG_ERROR in child.data.tags["reason"]
    stderr_logs = [a.path for a in client.list_artifacts(child.info.run_id, "logs/stderr/node-0")]
    assert stderr_logs, "each rank's stderr is kept in the attempt's MLflow run"
    assert job_processes(summary["run_id"]) == []


def test_a_segfault_beside_a_peer_error_is_a_crash_resumed_from_the_newest_checkpoint(cli_env):
    # 2 nodes x 2 processes; rank 3 dies of SIGSEGV at step 30, its node-mate rank 2 sees the peer go
    result = run_cli(
        [
            "drill",
            SPEC,
            "--fault",
            "crash",
            "--rank",
            "3",
            "--at-step",
            "30",
            "--no-compare-torchrun",
            "--set",
            "resources.procs_per_node=2",
            "--set",
            "workload.steps=60",
            "--set",
            "checkpoint.every_steps=10",
            "--json",
        ],
        cli_env,
        timeout_s=400,
    )
    report = summary_of(result)
    assert report["injected_at_step"] == 30, report
    assert report["outcomes"] == ["CRASHED", "SUCCEEDED"], report
    assert report["resumed_from_step"] >= 20 and report["lost_steps"] <= 10, report
    # exact on 4 ranks too: the resumed run's new DDP must not add gradients in another order
    assert report["params_match_baseline"] is True, report
    assert report["broken_rules"] == [] and report["passed"] is True, report


def test_a_plain_torchrun_script_succeeds_and_says_what_is_off(cli_env):
    result = run_cli(["run", SPEC, *PLAIN, "--set", "workload.args=[]", "--json"], cli_env)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["SUCCEEDED"], [a["reason"] for a in summary["attempts"]]
    assert "checkpoints" in summary["features_off"] and "hang_detection" in summary["features_off"]
    tags = MlflowClient(summary["tracking_uri"]).get_run(summary["mlflow_run_id"]).data.tags
    assert tags["workload_mode"] == "plain" and "progress" in tags["features_off"]


def test_a_plain_script_that_raises_shows_its_exception(cli_env):
    result = run_cli(["run", SPEC, *PLAIN, "--set", "workload.args=[--raise-on-rank, '1']", "--json"], cli_env)
    assert result.returncode == 1
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["USER_ERROR"]
    assert "RuntimeError: the data folder /data/shard-1 is empty" in summary["reason"]
    assert "rank 1" in summary["reason"]


@pytest.mark.parametrize("warm", ["true", "false"])
def test_a_rank_that_does_not_exit_after_its_peers_finished_is_a_hang_of_its_node(cli_env, warm, tmp_path):
    # node 1's rank exits 0 and its agent waits at torchrun's exit barrier: that node is done, not
    # lost; rank 0 trained too but a thread it forgot keeps its interpreter from ending
    result = run_cli(
        [
            "run",
            SPEC,
            "--set",
            "workload.entrypoint=tests/integration/workloads/linger_at_exit.py",
            "--set",
            "workload.mode=plain",
            "--set",
            "workload.args=[--linger, '-1']",
            "--set",
            f"resources.warm_workers={warm}",
            "--set",
            "fault_tolerance.exit_timeout_s=3",
            "--set",
            "fault_tolerance.max_restarts=0",
            "--json",
        ],
        cli_env,
    )
    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["HUNG"], summary["reason"]
    assert "node 0 still running" in summary["reason"] and "after node 1 finished" in summary["reason"]
    client = MlflowClient(summary["tracking_uri"])
    [child] = attempt_runs(client, summary)
    stacks = [a.path for a in client.list_artifacts(child.info.run_id, "stacks")]
    assert stacks == ["stacks/rank-0.txt"]  # the rank still running, not its finished peer
    stack = Path(client.download_artifacts(child.info.run_id, stacks[0], str(tmp_path))).read_text()
    assert '"forgotten"' in stack, stack  # the thread that holds it, by name
    assert job_processes(summary["run_id"]) == []


def test_a_slow_starting_plain_script_is_not_killed(cli_env):
    result = run_cli(
        [
            "run",
            SPEC,
            *PLAIN,
            "--set",
            "workload.args=[--sleep-before-init, '6']",
            "--set",
            "fault_tolerance.startup_timeout_s=2",
            "--json",
        ],
        cli_env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    attempts = summary_of(result)["attempts"]
    assert [a["outcome"] for a in attempts] == ["SUCCEEDED"], [a["reason"] for a in attempts]


def test_a_short_soak_detects_every_fault_as_its_own_kind(cli_env):
    # beside process faults (each has a drill in test_drills), a storage endpoint that stops
    # answering and a damaged checkpoint found at the restore
    kinds = ["crash", "storage-outage", "kill", "corrupt-checkpoint"]
    result = run_cli(
        [
            "soak",
            SPEC,
            "--faults",
            "4",
            "--seed",
            "7",
            "--kinds",
            ",".join(kinds),
            "--set",
            "workload.steps=400",
            "--set",
            f"checkpoint.uri={unique_prefix()}",
            "--set",
            "checkpoint.every_steps=20",
            "--set",
            "fault_tolerance.hang_timeout_s=5",
            "--set",
            "fault_tolerance.heartbeat_timeout_s=4",
            "--json",
        ],
        cli_env,
        timeout_s=900,
    )
    report = summary_of(result)
    assert "per_fault" in report, (report, result.stderr[-4000:])
    assert {f["kind"] for f in report["per_fault"]} == set(kinds)
    assert all(c["injected"] and c["detected"] == c["expected"] for c in report["per_fault"]), report["per_fault"]
    assert [f["rejected_at_restore"] for f in report["per_fault"] if f["kind"] == "corrupt-checkpoint"] == [True]
    assert report["misclassified"] == [] and report["unexplained_attempts"] == []
    assert report["late_injections"] == [] and report["over_lost"] == []
    assert report["params_match_baseline"] is True and report["leftovers"] == []
    assert report["passed"] is True and result.returncode == 0
