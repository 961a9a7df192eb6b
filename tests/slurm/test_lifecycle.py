"""The lifecycle on a real Slurm cluster: one batch job per attempt across node namespaces, faults
detected with Slurm's evidence, recovered with exact resume, and nothing left in the queue or on the
nodes (checked after every test by the slurm_env fixture)."""

from __future__ import annotations

import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import attempt_runs, run_cli, summary_of

# a drill is two runs (its fault-free baseline the first time) and a run starts a Slurm job per attempt
pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.timeout(600)]

SPEC = "examples/digits/spec.yaml"
ON_SLURM = [
    "--set",
    "resources.backend=slurm",
    "--set",
    "workload.steps=60",
    "--set",
    "checkpoint.every_steps=10",
    "--set",
    "fault_tolerance.heartbeat_timeout_s=6",
]


@pytest.fixture(scope="module")
def drill_home(tmp_path_factory):
    """One home for the drills, so they share one fault-free baseline."""
    return tmp_path_factory.mktemp("slurm-drills")


def jobs_of(cluster, run_id: str | None) -> list[dict[str, str]]:
    """Slurm's own record of the run's jobs (jobcomp/filetxt), oldest first."""
    lines = (cluster.folder / "log" / "jobcomp.txt").read_text().splitlines()
    records = [dict(item.split("=", 1) for item in line.split() if "=" in item) for line in lines]
    return [r for r in records if r.get("Name", "").startswith(f"trainflow-{run_id or ''}")]


def drill(env, home, fault: str, *extra: str) -> dict:
    result = run_cli(
        ["drill", SPEC, "--fault", fault, "--at-step", "30", "--no-compare-torchrun", *ON_SLURM, *extra, "--json"],
        {**env, "TRAINFLOW_HOME": str(home)},
        timeout_s=400,
    )
    report = summary_of(result)
    assert report["injected"], result.stderr[-3000:]
    report["log"] = [line for line in result.stderr.splitlines() if "ended" in line or "node" in line][-12:]
    return report


def test_two_node_job_runs_the_whole_lifecycle_as_one_slurm_job(slurm_env, slurm_cluster):
    result = run_cli(["run", SPEC, *ON_SLURM, "--json"], slurm_env, timeout_s=300)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert summary["status"] == "succeeded" and summary["final_step"] == 60
    assert [a["outcome"] for a in summary["attempts"]] == ["SUCCEEDED"]
    assert summary["attempts"][0]["world_size"] == 2
    assert [c["step"] for c in summary["checkpoints"]][-1] == 60
    assert all(c["verified"] for c in summary["checkpoints"])
    assert summary["teardown"]["clean"] is True
    jobs = jobs_of(slurm_cluster, summary["run_id"])
    assert [(j["JobState"], j["NodeCnt"]) for j in jobs] == [("COMPLETED", "2")]


# (kill takes the crash's path with SIGKILL; `trainflow drill --fault kill` passes the same way, and
# is left out to keep the Slurm tests to a few minutes)
@pytest.mark.parametrize("fault, detected", [("crash", "CRASHED"), ("hang", "HUNG"), ("preempt", "PREEMPTED")])
def test_process_faults_and_preemption_are_recovered_with_exact_resume(
    slurm_env, slurm_cluster, drill_home, fault, detected
):
    report = drill(slurm_env, drill_home, fault)
    assert report["outcomes"] == [detected, "SUCCEEDED"], (report["reasons"], report["log"])
    assert report["params_match_baseline"] is True, report
    assert report["resources_released"] is True, report["leftovers"]
    assert report["passed"] is True, report["broken_rules"]
    if fault == "preempt":
        assert report["lost_steps"] == 0
    else:
        assert report["lost_steps"] <= 2 * 10


def test_lost_node_is_detected_excluded_and_the_job_resumes_exactly_elsewhere(slurm_env, slurm_cluster, drill_home):
    report = drill(slurm_env, drill_home, "node-loss", "--node", "1")
    assert report["outcomes"] == ["NODE_LOST", "SUCCEEDED"], (report["reasons"], report["log"])
    assert report["params_match_baseline"] is True
    assert report["resources_released"] is True, report["leftovers"]
    assert report["passed"] is True, report["broken_rules"]
    faulted, retried = last_run_jobs(slurm_cluster)
    assert "node1" in hostnames(faulted["NodeList"])  # the drill cut node 1 of the first attempt's job
    assert "node1" not in hostnames(retried["NodeList"])
    assert len(hostnames(retried["NodeList"])) == 2  # excluded, not shrunk: a third node took its place


def last_run_jobs(cluster) -> list[dict[str, str]]:
    records = jobs_of(cluster, None)
    return [r for r in records if r["Name"] == records[-1]["Name"]]


def hostnames(nodelist: str) -> list[str]:
    return subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()


def test_time_limit_warning_preempts_with_an_emergency_checkpoint_and_the_run_resumes(slurm_env, slurm_cluster):
    # Slurm checks time limits every 30 s, so the warning comes up to 30 s early (the manual says up
    # to 60): with a 2-minute limit and a 40 s warning it lands 50-80 s into the first attempt (20 s
    # at worst), which is still training (0.5 s steps: 300 cannot finish in time), and leaves the
    # emergency checkpoint 40 s; later attempts train at full speed, done well before their warning.
    # Only the run's own checkpoints (every_steps above the run) are the emergency one and the last.
    result = run_cli(
        [
            "run",
            SPEC,
            *ON_SLURM,
            "--set",
            "workload.entrypoint=tests/integration/workloads/slow_first_attempt.py",
            "--set",
            "workload.args=[--first-attempt-step-s, '0.5']",
            "--set",
            "workload.steps=300",
            "--set",
            "checkpoint.every_steps=1000",
            "--set",
            "checkpoint.keep_last=100",
            "--set",
            "slurm.time_limit='2'",
            "--set",
            "slurm.warn_before_limit_s=40",
            "--json",
        ],
        slurm_env,
        timeout_s=400,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["PREEMPTED", "SUCCEEDED"], summary["attempts"]
    warned, resumed = summary["attempts"]
    assert "slurm job" in warned["reason"] and "the time limit's warning" in warned["reason"], warned["reason"]
    assert 0 < warned["last_step"] < 300
    assert warned["lost_steps"] == 0
    assert resumed["resumed_from_step"] == warned["last_step"]
    emergency = [c for c in summary["checkpoints"] if c["step"] == warned["last_step"]]
    assert emergency and emergency[0]["verified"], summary["checkpoints"]
    assert summary["status"] == "succeeded" and summary["final_step"] == 300
    jobs = jobs_of(slurm_cluster, summary["run_id"])
    print(
        f"time-limit warning: {warned['reason']}; first job {jobs[0]['StartTime']} to {jobs[0]['EndTime']}, "
        f"second {jobs[1]['StartTime']} to {jobs[1]['EndTime']}"
    )
    assert [j["TimeLimit"] for j in jobs] == ["2", "2"], jobs
    # the first job ended after its save, before the limit: Slurm did not have to time it out
    assert jobs[0]["JobState"] != "TIMEOUT" and jobs[1]["JobState"] == "COMPLETED", jobs
    ran = datetime.fromisoformat(jobs[0]["EndTime"]) - datetime.fromisoformat(jobs[0]["StartTime"])
    assert ran.total_seconds() < 120, jobs


def test_a_script_printing_a_lot_keeps_each_node_log_within_its_bound_on_slurm(slurm_env, tmp_path):
    bound_mb, mib = 1, 2**20
    result = run_cli(
        [
            "run",
            SPEC,
            *ON_SLURM,
            "--set",
            "workload.entrypoint=tests/integration/workloads/loud_output.py",
            "--set",
            "workload.mode=plain",
            "--set",
            "workload.args=[--steps, '20', --mib, '1']",
            "--set",
            f"tracking.max_node_log_mb={bound_mb}",
            "--set",
            "fault_tolerance.max_restarts=0",
            "--json",
        ],
        slurm_env,
        timeout_s=400,
    )
    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)
    client = MlflowClient(summary["tracking_uri"])
    attempt = attempt_runs(client, summary)[0]
    logs = Path(client.download_artifacts(attempt.info.run_id, "logs", str(tmp_path)))

    # each of the 2 nodes was written up to 2 x 20 MiB; each log keeps its bound and says what it dropped
    texts = []
    for node in (0, 1):
        log = logs / f"node-{node}.log"
        assert log.stat().st_size <= bound_mb * mib + 4096, log.stat().st_size
        texts.append(log.read_text(errors="replace"))
        assert "bytes of this node's output dropped here" in texts[-1]
    # the end is kept: the rank that failed first says why (the other node's step was cancelled then)
    assert any("ran out of data after 20 steps" in text for text in texts)
    # the rank is named from its agent's account, in its own word: the message it gave sys.exit
    assert re.search(r"rank [01] on node [01] exited with code 1", summary["reason"]), summary["reason"]
    assert "ran out of data after 20 steps" in summary["reason"], summary["reason"]
    tails = sorted(p.name for p in (logs / "stderr").rglob("local-rank-*"))
    assert tails == ["local-rank-0", "local-rank-0"]
