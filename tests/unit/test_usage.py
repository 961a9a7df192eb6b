"""trainflow.reporting.usage: the figures each run recorded, summed per team, owner or experiment, read from a
real MLflow SQLite store written the way the lifecycle writes it; and `trainflow usage`'s outputs."""

from __future__ import annotations

import csv
import io
import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainflow.cli import app
from trainflow.reporting.tracking import Tracker
from trainflow.reporting.usage import (
    GroupBy,
    RunUsage,
    UsageError,
    build_report,
    compare_limits,
    parse_since,
    peak_devices,
)

RUNS = [
    # experiment, team, owner, world size, status, device_hours, wasted, lost_work_s, recovery_s, attempts,
    # quota wait, checkpoint bytes
    (
        "digits",
        "vision",
        "ada",
        2,
        "succeeded",
        0.5,
        0.1,
        60.0,
        30.0,
        [("CRASHED", 2, 1.5), ("SUCCEEDED", 2, None)],
        12.0,
        [100, 200],
    ),
    (
        "digits",
        "vision",
        "bob",
        4,
        "failed",
        1.0,
        0.4,
        120.0,
        0.0,
        [("HUNG", 4, 9.0), ("NODE_LOST", 3, 4.0)],
        None,
        [50],
    ),
    ("nlp", "nlp", "ada", 2, "succeeded", 0.25, 0.0, 0.0, 0.0, [("SUCCEEDED", 2, None)], 3.0, []),
]


@pytest.fixture
def store(recorded: Path, tmp_path, monkeypatch):
    """A copy of the recorded store of its own for each test, under a home of its own."""
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    shutil.copyfile(recorded, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """Three lifecycle runs and their attempts, recorded once with trainflow's own tracker."""
    folder = tmp_path_factory.mktemp("usage")
    path = folder / "mlflow.db"
    with pytest.MonkeyPatch.context() as patch:  # the artifacts go under this home, not the user's
        patch.setenv("TRAINFLOW_HOME", str(folder / "home"))
        _record(Tracker(f"sqlite:///{path}"))
    return path


def _record(tracker: Tracker) -> None:
    for index, (
        experiment,
        team,
        owner,
        world,
        status,
        hours,
        wasted,
        lost_s,
        recovery_s,
        attempts,
        wait,
        sizes,
    ) in enumerate(RUNS):
        run = tracker.start_run(
            experiment, f"run-{index}", {"team": team, "owner": owner, "trainflow.run_id": f"run-{index}"}
        )
        tracker.log_params(run, {"world_size": world})
        figures = {
            "device_hours": hours,
            "wasted_device_hours": wasted,
            "lost_work_s": lost_s,
            "recovery_s_total": recovery_s,
        }
        if wait is not None:
            figures["quota_wait_s"] = wait
        for key, value in figures.items():
            tracker.log_metrics(run, [(key, value, 0, time.time())])
        tracker.log_json(
            run, [{"step": 10 * (i + 1), "bytes": size} for i, size in enumerate(sizes)], "checkpoints/index.json"
        )
        for number, (outcome, attempt_world, latency) in enumerate(attempts, start=1):
            child = tracker.start_run(
                experiment,
                f"run-{index}-attempt-{number}",
                {"trainflow.run_id": f"run-{index}", "attempt": str(number), "outcome": outcome},
                parent=run,
            )
            tracker.log_params(child, {"world_size": attempt_world})
            if latency is not None:
                tracker.log_metrics(child, [("detection_latency_s", latency, 0, time.time())])
            tracker.end_run(child, "FINISHED")
        tracker.set_tags(run, {"status": status})
        tracker.end_run(run, "FINISHED" if status == "succeeded" else "FAILED")
    unfinished = tracker.start_run("digits", "killed", {"team": "vision", "trainflow.run_id": "killed"})
    tracker.log_params(unfinished, {"world_size": 2})
    tracker.end_run(unfinished, "KILLED")


def test_groups_sum_what_each_run_recorded(store):
    report = build_report(store, GroupBy.team, parse_since("30d"))
    vision, nlp = report.groups
    assert (vision.group, nlp.group) == ("vision", "nlp")
    assert vision.runs == 3 and vision.succeeded == 1 and vision.unmeasured_runs == 1
    assert vision.device_hours == pytest.approx(1.5) and vision.wasted_device_hours == pytest.approx(0.5)
    assert vision.wasted_share == pytest.approx(0.5 / 1.5)
    assert vision.lost_work_device_hours == pytest.approx((2 * 60 + 4 * 120) / 3600)
    assert vision.recovery_device_hours == pytest.approx(2 * 30 / 3600)
    assert vision.detection_device_hours == pytest.approx((2 * 1.5 + 4 * 9.0 + 3 * 4.0) / 3600)
    assert vision.failures == {"CRASHED": 1, "HUNG": 1, "NODE_LOST": 1}
    assert vision.quota_wait_s == 12.0 and nlp.quota_wait_s == 3.0  # 0 where a run recorded none
    assert vision.checkpoint_bytes == 350 and nlp.checkpoint_bytes == 0
    assert nlp.success_rate == 1.0 and nlp.failures == {}
    assert report.total.runs == 4 and report.total.device_hours == pytest.approx(1.75)
    assert report.total.failures == {"CRASHED": 1, "HUNG": 1, "NODE_LOST": 1}


def test_by_owner_and_experiment(store):
    owners = {g.group: g for g in build_report(store, GroupBy.owner, 86400).groups}
    assert set(owners) == {"ada", "bob", "(none)"}
    assert owners["ada"].runs == 2 and owners["ada"].device_hours == pytest.approx(0.75)
    experiments = {g.group: g.runs for g in build_report(store, GroupBy.experiment, 86400).groups}
    assert experiments == {"digits": 3, "nlp": 1}


def test_runs_started_before_the_period_are_left_out(store):
    import time

    report = build_report(store, GroupBy.team, 3600, now=time.time() + 2 * 3600)
    assert report.groups == [] and report.total.runs == 0


def test_limits_are_put_beside_each_teams_peak(store):
    report = build_report(store, GroupBy.team, 86400)
    compare_limits(report, {"vision": 4})
    assert {g.group: g.device_limit for g in report.groups} == {"vision": 4, "nlp": None}
    assert report.limits_checked


def usage(start, end, world):
    return RunUsage("m", "r", "e", "t", "o", True, True, start, end, world, 0, 0, 0, 0, 0, 0, 0, {})


def test_peak_demand_counts_devices_held_at_the_same_time():
    runs = [usage(0, 10, 2), usage(5, 20, 4), usage(10, 30, 2), usage(25, None, 8)]
    assert peak_devices(runs, now=40) == 10  # 8 still running from 25 with the 2 that started at 10
    assert peak_devices([usage(0, 10, 2), usage(10, 20, 2)], now=30) == 2  # one ends as the next starts
    assert peak_devices([], now=0) == 0


@pytest.mark.parametrize("text", ["", "30", "d", "-3d", "0d", "3y"])
def test_since_needs_a_number_and_a_unit(text):
    with pytest.raises(UsageError, match="--since"):
        parse_since(text)
    assert parse_since("2w") == 14 * 86400 and parse_since("90m") == 5400


def test_cli_prints_the_same_totals_as_text_json_and_csv(store, tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    runner = CliRunner()
    picture = tmp_path / "usage.png"
    as_json = runner.invoke(app, ["usage", "--tracking-uri", store, "--json", "--plot", str(picture)])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout.strip().splitlines()[-1])
    assert data["total"]["device_hours"] == pytest.approx(sum(g["device_hours"] for g in data["groups"]))
    assert data["total"]["device_hours"] == pytest.approx(1.75)
    assert data["total"]["wasted_device_hours"] == pytest.approx(0.5)
    assert data["limits_checked"] is False and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    as_csv = runner.invoke(app, ["usage", "--tracking-uri", store, "--csv", "--plot", str(picture)])
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(as_csv.stdout))}
    assert set(rows) == {"vision", "nlp", "total"}
    assert float(rows["total"]["device_hours"]) == pytest.approx(1.75)
    assert rows["vision"]["failures"] == "CRASHED=1;HUNG=1;NODE_LOST=1"
    text = runner.invoke(app, ["usage", "--tracking-uri", store, "--plot", str(picture)])
    assert text.exit_code == 0
    total = next(line for line in text.stdout.splitlines() if line.startswith("total"))
    assert "1.7500" in total and "0.5000 (29%)" in total and "CRASHED 1, HUNG 1, NODE_LOST 1" in total


def test_cli_refuses_bad_input_and_a_missing_store(store, tmp_path):
    runner = CliRunner()
    for args, named in [(["--by", "site"], "--by"), (["--since", "soon"], "--since"), (["--json", "--csv"], "--json")]:
        result = runner.invoke(app, ["usage", "--tracking-uri", store, *args])
        assert result.exit_code == 2 and named in result.stderr, (args, result.output)
    missing = f"sqlite:///{tmp_path / 'nowhere.db'}"
    result = runner.invoke(app, ["usage", "--tracking-uri", missing])
    assert result.exit_code == 2 and "no MLflow store" in result.stderr
    assert not (tmp_path / "nowhere.db").exists()
