"""fault_tolerance.rules on real torchrun jobs: a rule by exit code stops a run the built-in policy
would retry, a rule by a line of the failing rank's stderr retries one it would not; both say so."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import attempt_runs, job_processes, run_cli, summary_of

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
JOB = ["--set", "workload.steps=20", "--set", "checkpoint.every_steps=5", "--set", "resources.warm_workers=false"]


def fails_once(marker, step: int, say: str) -> list[str]:
    """Overrides for a job whose rank 1 says `say` on its stderr and exits 3 the first time it reaches `step`."""
    args = ["--fail-at-step", str(step), "--marker", str(marker), "--say", say]
    return [
        "--set",
        "workload.entrypoint=tests/integration/workloads/fail_once.py",
        "--set",
        f"workload.args={json.dumps(args)}",
    ]


def attempt_reasons(summary: dict) -> list[str]:
    client = MlflowClient(summary["tracking_uri"])
    return [run.data.tags["reason"] for run in attempt_runs(client, summary)]


def test_a_rule_by_exit_code_stops_a_run_the_restart_budget_would_retry(cli_env):
    result = run_cli(
        [
            "run",
            SPEC,
            *JOB,
            "--set",
            "workload.entrypoint=tests/integration/workloads/exit_at_step.py",
            "--set",
            "workload.args=[--exit-at-step, '7', --exit-rank, '1', --exit-code, '3']",
            "--set",
            "fault_tolerance.max_restarts=3",
            "--set",
            "fault_tolerance.rules=[{exit_code: 3, action: stop}]",
            "--json",
        ],
        cli_env,
    )

    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["CRASHED"]
    assert "stopped by rule" in summary["reason"]
    assert "fault_tolerance.rules[0] (exit code 3 -> stop) matched rank 1" in summary["reason"]
    [reason] = attempt_reasons(summary)
    assert "fault_tolerance.rules[0]" in reason
    assert summary["teardown"]["clean"] is True and job_processes(summary["run_id"]) == []


def test_a_rule_by_log_pattern_retries_a_run_the_built_in_policy_would_stop(cli_env, tmp_path):
    result = run_cli(
        [
            "run",
            SPEC,
            *JOB,
            *fails_once(tmp_path / "failed-once", 7, "fabric: link 3 flapped, try again"),
            "--set",
            "fault_tolerance.max_restarts=0",  # a crash alone would end the run
            "--set",
            "fault_tolerance.rules=[{log_pattern: 'link \\d+ flapped', outcome: INFRA}]",
            "--json",
        ],
        cli_env,
    )

    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["INFRA", "SUCCEEDED"]
    assert summary["attempts"][1]["resumed_from_step"] == 5
    first = attempt_reasons(summary)[0]
    assert first.startswith("fault_tolerance.rules[0] (log /link \\d+ flapped/ -> INFRA) matched rank 1 on node")
    assert "link 3 flapped" in first
