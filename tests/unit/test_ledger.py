"""trainflow.contracts.ledger: every figure of a run from its attempts, and the summary contract."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from trainflow.contracts import AttemptResult, Outcome, RunSummary, run_ledger
from trainflow.contracts.ledger import PRODUCTIVE, STALLS, percent, seconds
from trainflow.reporting.summary import closing_lines, run_status


def attempt(n, outcome, *, started, ended, detected, failed=None, first_step=None, resumed=0, last=0, totals=None):
    return AttemptResult(
        attempt=n,
        outcome=outcome,
        reason="r",
        world_size=2,
        started_at=started,
        ended_at=ended,
        detected_at=detected,
        failed_at=failed,
        last_step=last,
        resumed_from_step=resumed,
        first_step_at=first_step,
        totals=totals or {},
    )


def crash_then_success() -> list[AttemptResult]:
    """Attempt 1 runs steps 1-45 and crashes; attempt 2 resumes from 40 and runs 41-100: 105 steps
    at 0.2 s each (21 s), checkpoints stalling 0.5 s in all, 10% of step time waiting for data."""
    return [
        attempt(
            1,
            Outcome.CRASHED,
            started=100.0,
            ended=112.0,
            detected=111.0,
            failed=110.0,
            first_step=101.0,
            resumed=0,
            last=45,
            totals={"steps": 45, "step_time_s": 9.0, "data_wait_s": 0.9, "checkpoint_stall_s": 0.2},
        ),
        attempt(
            2,
            Outcome.SUCCEEDED,
            started=113.0,
            ended=130.0,
            detected=130.0,
            first_step=115.5,
            resumed=40,
            last=100,
            totals={"steps": 60, "step_time_s": 12.0, "data_wait_s": 1.2, "checkpoint_stall_s": 0.3},
        ),
    ]


def test_recovery_time_and_lost_steps():
    first, second = run_ledger(crash_then_success(), world_size=2).attempts
    assert first.recovery_s is None  # nothing to recover from
    assert first.lost_steps == 5  # steps 41..45 are redone
    assert first.detection_latency_s == 1.0
    assert second.recovery_s == 4.5  # first step at 115.5, failure detected at 111.0
    assert second.lost_steps == 0 and second.detection_latency_s is None and second.detected_at is None
    assert [r.outcome for r in (first, second)] == [Outcome.CRASHED, Outcome.SUCCEEDED]
    assert (first.steps_run, second.steps_run) == (45, 60)


def test_every_figure_once():
    f = run_ledger(crash_then_success(), world_size=2).figures
    assert f.wall_s == 30.0 and f.steps_run == 105 and f.useful_steps == 100 and f.lost_steps == 5
    assert f.mean_step_time_s == pytest.approx(0.2)
    assert f.productive_s == pytest.approx(20.0) and f.lost_work_s == pytest.approx(1.0)
    assert f.detection_s_total == 1.0 and f.recovery_s_total == 4.5 and f.checkpoint_stall_total_s == 0.5
    assert f.other_s == pytest.approx(30.0 - 20.0 - 1.0 - 1.0 - 4.5 - 0.5)
    assert f.goodput == round(20 / 30, 4)
    assert f.data_share == 0.1 and f.checkpoint_share == round(0.5 / 21, 4)
    assert f.device_hours == round(2 * 30 / 3600, 6)
    assert f.wasted_device_hours == round(2 * (1.0 + 1.0 + 4.5 + 0.5) / 3600, 6)


def test_the_segments_add_up_and_the_productive_share_is_the_goodput():
    ledger = run_ledger(crash_then_success(), world_size=2)
    segments = {label: (value, share) for label, value, share in ledger.segments()}
    assert sum(value for value, _ in segments.values()) == pytest.approx(ledger.figures.wall_s)
    assert segments[PRODUCTIVE][1] == ledger.figures.goodput
    assert percent(segments[STALLS][1]) == "1.7%"


def test_no_recovery_when_next_attempt_never_stepped():
    results = crash_then_success()
    results[1].first_step_at = None
    assert run_ledger(results, 2).attempts[1].recovery_s is None


def test_lost_steps_never_negative():
    results = crash_then_success()
    results[1].resumed_from_step = 50  # resumed past the last reported step
    assert run_ledger(results, 2).attempts[0].lost_steps == 0


def test_goodput_capped_at_one_and_zero_without_steps():
    fast = [
        attempt(
            1,
            Outcome.SUCCEEDED,
            started=0.0,
            ended=1.0,
            detected=1.0,
            last=10,
            totals={"steps": 10, "step_time_s": 50.0},
        )
    ]
    assert run_ledger(fast, 1).figures.goodput == 1.0
    plain = [attempt(1, Outcome.CRASHED, started=0.0, ended=5.0, detected=5.0, resumed=20, last=20)]
    figures = run_ledger(plain, 1).figures
    assert figures.goodput == 0.0 and figures.mean_step_time_s == 0.0 and figures.other_s == 5.0
    with pytest.raises(ValueError):
        run_ledger([], 1)


def test_run_status():
    assert run_status(crash_then_success()) == "succeeded"
    assert run_status(crash_then_success()[:1]) == "failed"
    assert run_status([]) == "failed"


def summary_of(results: list[AttemptResult], **fields) -> RunSummary:
    ledger = run_ledger(results, 2)
    values = dict(
        status=run_status(results),
        reason="finished at step 100",
        run_id="digits-x",
        mlflow_run_id="f" * 32,
        tracking_uri="sqlite:////tmp/home/mlflow.db",
        experiment="digits",
        prefect_flow_run_id="0-1-2",
        final_step=100,
        total_steps=100,
        final_loss=0.25,
        params_sha256="ab" * 32,
        checkpoints=[],
        snapshots_failed=[],
        attempts=ledger.attempts,
        stragglers=[],
        goodput=ledger.figures.goodput,
        features_off=[],
        costs=ledger.figures,
        diagnosis=[],
        plots=[],
    )
    return RunSummary(**{**values, **fields})


# the keys `trainflow run --json` printed before the summary was a typed model
JSON_KEYS = {
    "status",
    "reason",
    "run_id",
    "mlflow_run_id",
    "tracking_uri",
    "experiment",
    "prefect_flow_run_id",
    "final_step",
    "total_steps",
    "final_loss",
    "params_sha256",
    "checkpoints",
    "snapshots_failed",
    "attempts",
    "stragglers",
    "goodput",
    "features_off",
    "costs",
    "diagnosis",
    "plots",
}
ATTEMPT_KEYS = {
    "attempt",
    "outcome",
    "reason",
    "world_size",
    "resumed_from_step",
    "last_step",
    "started_at",
    "ended_at",
    "detected_at",
    "detection_latency_s",
    "recovery_s",
    "lost_steps",
}
COST_KEYS = {
    "wall_s",
    "device_hours",
    "wasted_device_hours",
    "recovery_s_total",
    "lost_work_s",
    "checkpoint_stall_total_s",
    "mean_step_time_s",
    "comm_share",
    "data_share",
    "checkpoint_share",
}


def test_the_json_contract_keeps_every_key_it_had():
    printed = summary_of(crash_then_success()).as_json_dict()
    assert set(printed) == JSON_KEYS  # nothing unset is printed (teardown, faults, rerun fields come later)
    assert all(ATTEMPT_KEYS <= set(row) for row in printed["attempts"])
    assert COST_KEYS <= set(printed["costs"])
    assert printed["attempts"][0]["outcome"] == "CRASHED"  # the outcome's name, as before
    again = RunSummary.model_validate({**printed, "teardown": {"clean": True, "survivors": []}}).as_json_dict()
    assert set(again) == JSON_KEYS | {"teardown"}
    with pytest.raises(ValueError, match="surprise"):
        RunSummary.model_validate({**printed, "surprise": 1})


def test_closing_lines_print_commands_that_work(monkeypatch):
    # as a person would type them, without the venv activated: PATH without the venv's bin
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    monkeypatch.setenv("PATH", path)
    summary = summary_of(crash_then_success()).as_json_dict()
    summary["tracking_uri"] = "sqlite:////tmp/my home/mlflow.db"
    lines = closing_lines(summary, "http://127.0.0.1:4200")
    [mlflow] = [line for line in lines if line.startswith("  MLflow: ")]
    command = mlflow.removeprefix("  MLflow: ").split("  (run")[0]
    assert command.endswith("ui --backend-store-uri 'sqlite:////tmp/my home/mlflow.db'")  # quoted for the shell
    program = command.split(" ui ")[0]
    ran = subprocess.run([*shlex.split(program), "ui", "--help"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and "--backend-store-uri" in ran.stdout, ran.stderr[-2000:]
    assert "  Prefect: http://127.0.0.1:4200/runs/flow-run/0-1-2" in lines
    assert (
        f"  goodput 66.7% of {seconds(summary['costs']['wall_s'])} wall time (first attempt's start to last "
        "attempt's end)" in lines
    )
    [temporary] = [line for line in closing_lines(summary, None) if line.startswith("  Prefect: ")]
    assert "temporary server" in temporary and "0-1-2" in temporary


def test_closing_lines_of_a_plain_script_claim_no_steps_and_no_goodput():
    summary = summary_of(crash_then_success(), features_off=["progress", "checkpoints"], final_step=0)
    lines = closing_lines(summary, None)
    assert lines[0] == "run digits-x: SUCCEEDED"
    assert "  attempt 1: CRASHED" in lines and "  attempt 2: SUCCEEDED" in lines
    assert any(line.startswith("  goodput: not measured (no step reports); ") for line in lines)
    assert not any("step 0" in line or "goodput 0" in line for line in lines)


def test_only_a_run_that_reported_its_steps_names_the_step_it_ended_at():
    assert summary_of(crash_then_success()).at_step() == " at step 100"
    plain = summary_of(crash_then_success(), features_off=["progress"], final_step=0)
    assert not plain.steps_reported and plain.at_step() == ""


def test_closing_lines_never_show_tracking_credentials():
    summary = summary_of(crash_then_success(), tracking_uri="https://bob:s3cret@mlflow.example:8443").as_json_dict()
    text = "\n".join(closing_lines(summary, None))
    assert "s3cret" not in text and "https://mlflow.example:8443" in text


def test_the_contracts_are_a_leaf():
    """trainflow.contracts imports nothing else of trainflow, so every part can depend on it."""
    import ast
    from pathlib import Path

    import trainflow.contracts

    folder = Path(trainflow.contracts.__file__).parent
    imported = set()
    for source in folder.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    ours = {name for name in imported if name.split(".")[0] == "trainflow"}
    assert ours and all(name.startswith("trainflow.contracts") for name in ours), ours
