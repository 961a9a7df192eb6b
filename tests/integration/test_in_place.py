"""In-process restart (fault_tolerance.in_process_restart): a rank's exception sends every rank back
to its memory copy in the process it already has, within the attempt, with exact resume; a rank
process that dies is replaced by its node's agent, and the new process goes on from the dead one's
copies while the others keep their processes; an exception whose outcome is not retried, or a death
with nothing in memory to go on from, ends the attempt as it always did."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import attempt_runs, job_processes, run_cli, summary_of

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"


def raising(tmp_path, error: str, *overrides: str, at_steps: tuple[int, ...] = (12,)) -> list[str]:
    """The `trainflow run` arguments of a 2 x 2 job whose rank 1 raises `error` once at each of
    `at_steps` (0: never)."""
    marker, pids = tmp_path / "raised", tmp_path / "pids"
    steps = ", ".join(f"--raise-at-step, '{step}'" for step in at_steps)
    args = f"[{steps}, --error, {error}, --marker, {marker}, --pids, {pids}]"
    sets = [
        "workload.entrypoint=tests/integration/workloads/raise_once.py",
        f"workload.args={args}",
        "workload.steps=30",
        "checkpoint.every_steps=5",
        "resources.procs_per_node=2",
        *overrides,
    ]
    return ["run", SPEC, *[part for value in sets for part in ("--set", value)], "--json"]


def pids_of(tmp_path) -> dict[str, list[int]]:
    return {p.name: [int(line) for line in p.read_text().split()] for p in sorted((tmp_path / "pids").iterdir())}


def test_an_exception_is_recovered_in_place_with_every_rank_process_kept(cli_env, tmp_path):
    baseline = run_cli(raising(tmp_path / "baseline", "DistNetworkError", at_steps=(0,)), cli_env)
    assert baseline.returncode == 0, baseline.stderr[-4000:]
    result = run_cli(
        raising(
            tmp_path,
            "DistNetworkError",
            "fault_tolerance.in_process_restart=true",
            "checkpoint.memory_every_steps=1",
        ),
        cli_env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    # one attempt: the four rank processes went on, each ran the script twice in the same process
    assert [a["outcome"] for a in summary["attempts"]] == ["SUCCEEDED"]
    pids = pids_of(tmp_path)
    assert sorted(pids) == ["rank-0", "rank-1", "rank-2", "rank-3"]
    assert all(len(runs) == 2 and runs[0] == runs[1] for runs in pids.values()), pids
    (restart,) = summary["attempts"][0]["in_place"]
    assert restart["outcome"] == "INFRA"
    assert restart["cause_rank"] == 1
    assert "DistNetworkError at step 12: injected at step 12" in restart["reason"]
    # rank 1 raised after step 12's update; the others may have copied step 12, rank 1 only 11
    assert (restart["failed_step"], restart["restored_step"], restart["lost_steps"]) == (12, 11, 0)
    assert (restart["ranks_kept"], restart["ranks_replaced"]) == (4, 0)
    assert set(restart["phases"]) == {"abort_s", "rejoin_s", "restore_s"}
    assert summary["costs"]["recovery_s_total"] == pytest.approx(restart["recovery_s"], abs=1e-3)
    # exact resume: the same parameters as the run without a failure
    assert summary["params_sha256"] == summary_of(baseline)["params_sha256"]
    assert summary["final_step"] == 30
    client = MlflowClient(summary["tracking_uri"])
    tag = client.get_run(summary["mlflow_run_id"]).data.tags["in_place_restarts"]
    assert tag.startswith("attempt 1 round 1: rank 1 raised DistNetworkError at step 12") and "-> step 11" in tag
    (child,) = attempt_runs(client, summary)
    assert child.data.metrics["in_place_restarts"] == 1
    assert {"in_place_abort_s", "in_place_rejoin_s", "in_place_restore_s"} <= set(child.data.metrics)
    assert job_processes(summary["run_id"]) == []


def test_an_exception_that_is_not_retried_ends_the_attempt_with_the_scripts_own_line(cli_env, tmp_path):
    result = run_cli(raising(tmp_path, "ValueError", "fault_tolerance.in_process_restart=true"), cli_env)
    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)
    (attempt,) = summary["attempts"]
    assert attempt["outcome"] == "USER_ERROR"
    assert "rank 1 raised ValueError at step 12: injected at step 12" in attempt["reason"]
    assert attempt["in_place"] == []
    assert all(len(runs) == 1 for runs in pids_of(tmp_path).values())
    assert job_processes(summary["run_id"]) == []


def test_recoveries_in_place_spend_the_retry_budget_and_the_next_failure_ends_the_run(cli_env, tmp_path):
    # max_infra_failures=2: the first two errors are recovered in place, each at its own step in a
    # round of its own; the third finds the budget spent, ends the attempt, and the run is not retried
    result = run_cli(
        raising(
            tmp_path,
            "DistNetworkError",
            "fault_tolerance.in_process_restart=true",
            "fault_tolerance.max_infra_failures=2",
            at_steps=(8, 16, 24),
        ),
        cli_env,
    )
    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)
    (attempt,) = summary["attempts"]
    assert attempt["outcome"] == "INFRA" and "DistNetworkError at step 24" in attempt["reason"]
    assert [(r["round"], r["failed_step"]) for r in attempt["in_place"]] == [(1, 8), (2, 16)]
    assert summary["reason"].startswith("infrastructure budget spent (2)")
    assert all(len(set(runs)) == 1 and len(runs) == 3 for runs in pids_of(tmp_path).values())
    assert job_processes(summary["run_id"]) == []


def test_a_rank_that_dies_is_replaced_in_place_while_the_other_three_processes_go_on(cli_env, tmp_path):
    # one checkpoint, at the end: a save in flight when a peer dies can keep its collective waiting
    # past SAVE_ENDS_WITHIN_S on a loaded machine, and the round is then no go (a full restart)
    only_final = "checkpoint.every_steps=30"
    baseline = run_cli(raising(tmp_path / "baseline", "SIGSEGV", only_final, at_steps=(0,)), cli_env)
    assert baseline.returncode == 0, baseline.stderr[-4000:]
    result = run_cli(
        raising(
            tmp_path,
            "SIGSEGV",
            only_final,
            "fault_tolerance.in_process_restart=true",
            "checkpoint.memory_every_steps=1",
        ),
        cli_env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["SUCCEEDED"], summary["attempts"][0]["reason"]
    # ranks 0, 2 and 3 ran the script again in their own processes; rank 1 is a new process
    pids = pids_of(tmp_path)
    assert all(len(runs) == 2 and runs[0] == runs[1] for rank, runs in pids.items() if rank != "rank-1"), pids
    assert len(pids["rank-1"]) == 2 and pids["rank-1"][0] != pids["rank-1"][1], pids
    (restart,) = summary["attempts"][0]["in_place"]
    assert restart["outcome"] == "CRASHED"
    assert restart["cause_rank"] == 1 and "was killed by SIGSEGV" in restart["reason"]
    # rank 1 died after step 12's update, before its copy of step 12: the round goes back to 11, and
    # the step the others had finished since (12) is trained again; they failed in step 13
    assert (restart["failed_step"], restart["restored_step"], restart["lost_steps"]) == (13, 11, 1)
    assert (restart["ranks_kept"], restart["ranks_replaced"]) == (3, 1)
    assert set(restart["phases"]) == {"abort_s", "rejoin_s", "replace_s", "restore_s"}
    assert 0 < restart["phases"]["replace_s"] <= restart["phases"]["rejoin_s"]
    assert summary["params_sha256"] == summary_of(baseline)["params_sha256"]
    assert summary["final_step"] == 30
    assert job_processes(summary["run_id"]) == []


def test_a_rank_that_dies_before_its_first_memory_copy_falls_back_to_a_full_restart(cli_env, tmp_path):
    result = run_cli(
        raising(tmp_path, "SIGKILL", "fault_tolerance.in_process_restart=true", at_steps=(1,)),
        cli_env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    # nothing in memory to go on from: the attempt ends as it would without in-process restart
    assert [a["outcome"] for a in summary["attempts"]] == ["KILLED", "SUCCEEDED"]
    assert summary["attempts"][0]["in_place"] == []
    assert "rank 1" in summary["attempts"][0]["reason"] and "SIGKILL" in summary["attempts"][0]["reason"]
    assert job_processes(summary["run_id"]) == []


def test_a_soak_with_in_process_restart_recovers_deaths_hangs_and_exceptions_in_place(cli_env):
    # a frozen rank is ended by the watcher and replaced: its peer, blocked in a collective with it,
    # fails at once into the round; the corrupt checkpoint's kill still ends its attempt, so the
    # next one restores from the store and passes the damaged checkpoint over
    kinds = ["crash", "hang", "exception", "corrupt-checkpoint"]
    result = run_cli(
        [
            "soak",
            SPEC,
            "--faults",
            "4",
            "--seed",
            "3",
            "--kinds",
            ",".join(kinds),
            *["--set", "workload.steps=300", "--set", "checkpoint.every_steps=20"],
            *["--set", "fault_tolerance.hang_timeout_s=5", "--set", "fault_tolerance.heartbeat_timeout_s=4"],
            *["--set", "fault_tolerance.in_process_restart=true", "--json"],
        ],
        cli_env,
        timeout_s=900,
    )
    report = summary_of(result)
    assert "per_fault" in report, (report, result.stderr[-4000:])
    faults = {f["kind"]: f for f in report["per_fault"]}
    assert set(faults) == set(kinds)
    assert all(f["injected"] and f["detected"] == f["expected"] for f in faults.values()), report["per_fault"]
    assert sorted(kind for kind, f in faults.items() if f["in_place"]) == ["crash", "exception", "hang"]
    assert faults["corrupt-checkpoint"]["rejected_at_restore"] is True
    assert report["misclassified"] == [] and report["unexplained_attempts"] == []
    assert report["late_injections"] == [] and report["over_lost"] == []
    assert report["params_match_baseline"] is True and report["leftovers"] == []
    assert report["passed"] is True and result.returncode == 0
