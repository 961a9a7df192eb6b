"""`trainflow usage` and `trainflow audit` over the session's finished runs (finished_runs.py): a CLI run
of team usage-vision that fails over once (a secret in its workers' environment, checkpoints in S3), two
reruns of it (one with drift allowed), and a run of team usage-nlp that fails. Usage totals must equal the sums
over the MLflow runs, in text, JSON and CSV; the audit trail names who launched each run and how, and
holds no secret."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest

from tests.integration.conftest import run_cli, summary_of
from tests.integration.finished_runs import PROBE, SECRET_VALUE, FinishedRuns
from trainflow.runspec.tracking import reserved_tag

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # the first test may wait for four runs


def recorded_totals(runs: FinishedRuns) -> dict[str, dict]:
    """Per team, straight from MLflow: device-hours, wasted hours and failed attempts by outcome."""
    client = runs.client
    experiment = client.get_experiment_by_name("usage").experiment_id
    totals: dict[str, dict] = {}
    for run in client.search_runs([experiment]):
        if "mlflow.parentRunId" in run.data.tags:
            continue
        team = totals.setdefault(run.data.tags["team"], {"runs": 0, "device_hours": 0.0, "wasted": 0.0, "failures": {}})
        team["runs"] += 1
        team["device_hours"] += run.data.metrics["summary/device_hours"]
        team["wasted"] += run.data.metrics["summary/wasted_device_hours"]
        for child in client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{run.info.run_id}'"):
            outcome = child.data.tags["outcome"]
            if outcome != "SUCCEEDED":
                team["failures"][outcome] = team["failures"].get(outcome, 0) + 1
    return totals


def test_usage_totals_equal_the_sums_over_the_mlflow_runs(finished_runs: FinishedRuns):
    expected = recorded_totals(finished_runs)
    assert expected["usage-vision"]["runs"] == 3 and expected["usage-nlp"]["runs"] == 1
    assert (
        expected["usage-vision"]["failures"] == {"CRASHED": 1} and sum(expected["usage-nlp"]["failures"].values()) == 1
    )
    picture = finished_runs.folder / "usage.png"
    base = [
        "usage",
        "--by",
        "team",
        "--since",
        "1d",
        "--tracking-uri",
        finished_runs.tracking_uri,
        "--plot",
        str(picture),
    ]

    as_json = run_cli([*base, "--json"], finished_runs.env)
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    report = summary_of(as_json)
    groups = {g["group"]: g for g in report["groups"]}
    for team, figures in expected.items():
        assert groups[team]["runs"] == figures["runs"]
        assert groups[team]["device_hours"] == pytest.approx(figures["device_hours"], abs=1e-6)
        assert groups[team]["wasted_device_hours"] == pytest.approx(figures["wasted"], abs=1e-6)
        assert groups[team]["failures"] == figures["failures"]
    assert report["total"]["device_hours"] == pytest.approx(sum(f["device_hours"] for f in expected.values()), abs=1e-6)
    assert groups["usage-vision"]["succeeded"] == 3 and groups["usage-nlp"]["success_rate"] == 0.0
    assert groups["usage-vision"]["checkpoint_bytes"] > 0  # the vision runs kept checkpoints
    assert groups["usage-vision"]["peak_devices"] == 2  # the runs ran one after the other, 2 devices each
    assert report["limits_checked"] is True and groups["usage-vision"]["device_limit"] is None  # no quota set
    assert picture.read_bytes()[:4] == b"\x89PNG"

    as_csv = run_cli([*base, "--csv"], finished_runs.env)
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(as_csv.stdout))}
    for team, figures in expected.items():
        assert float(rows[team]["device_hours"]) == pytest.approx(figures["device_hours"], abs=1e-6)
        assert float(rows[team]["wasted_device_hours"]) == pytest.approx(figures["wasted"], abs=1e-6)
        assert rows[team]["failures"] == ";".join(f"{k}={v}" for k, v in sorted(figures["failures"].items()))

    as_text = run_cli(base, finished_runs.env)
    lines = {line.split()[0]: line for line in as_text.stdout.splitlines() if line.split()}
    for team, figures in expected.items():
        assert f"{figures['device_hours']:.4f}" in lines[team], lines[team]
        for kind, count in figures["failures"].items():
            assert f"{kind} {count}" in lines[team]
    assert f"{sum(f['device_hours'] for f in expected.values()):.4f}" in lines["total"]


def audit(runs: FinishedRuns, run_id: str) -> tuple[str, dict]:
    text = run_cli(["audit", run_id, "--tracking-uri", runs.tracking_uri], runs.env)
    as_json = run_cli(["audit", run_id, "--tracking-uri", runs.tracking_uri, "--json"], runs.env)
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr[-3000:] + as_json.stderr[-3000:]
    return text.stdout, summary_of(as_json)


def test_audit_of_a_cli_run_names_who_launched_it_and_holds_no_secret(finished_runs: FinishedRuns):
    original = finished_runs.original
    text, trail = audit(finished_runs, original["mlflow_run_id"])
    recorded = finished_runs.client.get_run(original["mlflow_run_id"]).data.tags
    assert trail["origin"]["launched_via"] == "cli" and "prefect_deployment" not in trail["origin"]
    assert trail["origin"]["launched_by_user"] and trail["origin"]["launched_from_host"] == os.uname().nodename
    assert trail["identity"]["spec_hash"] == recorded["spec_hash"] and (trail["team"], trail["owner"]) == (
        "usage-vision",
        "ada",
    )
    assert [(a["attempt"], a["outcome"]) for a in trail["attempts"]] == [(1, "CRASHED"), (2, "SUCCEEDED")]
    reruns = {finished_runs.rerun["mlflow_run_id"], finished_runs.drifted_rerun["mlflow_run_id"]}
    assert sorted(trail["reruns"]) == sorted(reruns)
    events = [e["event"] for e in trail["events"]]
    assert "trainflow.attempt.failed" in events and "trainflow.run.succeeded" in events
    assert "prefect.flow-run.Completed" in events
    assert f"launched via cli by {trail['origin']['launched_by_user']}" in text
    assert f"spec_hash: {recorded['spec_hash']}" in text
    recorded_params = finished_runs.client.get_run(original["mlflow_run_id"]).data.params
    for secret in [SECRET_VALUE, finished_runs.env["AWS_ACCESS_KEY_ID"], finished_runs.env["AWS_SECRET_ACCESS_KEY"]]:
        assert secret not in text and secret not in json.dumps(trail), secret
        assert secret not in json.dumps(recorded) and secret not in json.dumps(recorded_params), secret


def test_audit_of_a_rerun_with_drift_allowed_shows_the_override(finished_runs: FinishedRuns):
    drifted = finished_runs.drifted_rerun
    text, trail = audit(finished_runs, drifted["run_id"])  # by trainflow run id this time
    assert trail["mlflow_run_id"] == drifted["mlflow_run_id"]
    assert trail["rerun"] == {
        "rerun_of": finished_runs.original["mlflow_run_id"],
        "rerun_drift": "true",
        "rerun_allow_drift": "true",
    }
    assert any(PROBE in line for line in trail["drift"]), trail["drift"]
    assert trail["origin"]["launched_via"] == "cli"
    assert f"rerun of {finished_runs.original['mlflow_run_id']}: drift true, --allow-drift given" in text


def test_audit_of_an_unknown_run_is_bad_input(finished_runs: FinishedRuns):
    result = run_cli(["audit", "no-such-run", "--tracking-uri", finished_runs.tracking_uri], finished_runs.env)
    assert result.returncode == 2 and "RUN_ID 'no-such-run'" in result.stderr


def test_every_tag_trainflow_writes_is_one_a_spec_may_not_set(finished_runs: FinishedRuns):
    client = finished_runs.client
    experiment = client.get_experiment_by_name("usage").experiment_id
    written = {name for run in client.search_runs([experiment]) for name in run.data.tags}
    users = {"team", "owner"}  # the spec's tracking.tags of these runs
    assert users <= written
    assert sorted(name for name in written - users if not reserved_tag(name)) == []
