"""`trainflow usage` and `trainflow audit` over real runs: a CLI run of team usage-vision that fails over
once (a secret in its workers' environment, checkpoints in S3), a rerun of it with drift allowed, and
a run of team usage-nlp that fails. Usage totals must equal the sums over the MLflow runs, in text, JSON
and CSV; the audit trail names who launched each run and how, and holds no secret."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import run_cli, s3_environment, summary_of, unique_prefix
from tests.integration.test_rerun import PROBE, drifted_environment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # the first test also waits for three runs

SECRET_NAME, SECRET_VALUE = "TRAINFLOW_AUDIT_SECRET", "audit-secret-value-never-recorded"
SPEC = "examples/digits/spec.yaml"


def run_args(entrypoint: str, args: list[str], team: str, owner: str, *more: str) -> list[str]:
    return ["run", SPEC, "--set", f"workload.entrypoint={entrypoint}", "--set", f"workload.args={json.dumps(args)}",
            "--set", "workload.steps=10", "--set", "checkpoint.every_steps=5", "--set", "tracking.experiment=usage",
            "--set", f"tracking.tags={json.dumps({'team': team, 'owner': owner})}", *more, "--json"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prefect_api, s3_endpoint):
    folder = tmp_path_factory.mktemp("usage-audit")
    env = {**os.environ, **s3_environment(s3_endpoint), "TRAINFLOW_HOME": str(folder / "home"),
           "PREFECT_API_URL": prefect_api, SECRET_NAME: SECRET_VALUE}
    env.pop("AWS_PROFILE", None)
    failing_over = run_cli(run_args(
        "tests/integration/workloads/fail_once.py", ["--fail-at-step", "5", "--marker", str(folder / "failed")],
        "usage-vision", "ada", "--set", f"workload.secret_env=[{SECRET_NAME}]", "--set", f"checkpoint.uri={unique_prefix()}",
    ), env)
    assert failing_over.returncode == 0, failing_over.stderr[-4000:]
    original = summary_of(failing_over)
    drifted = drifted_environment({"folder": folder, "env": env})
    # the probe's folder goes before this checkout, not instead of it: the rerun must run this code
    drifted["PYTHONPATH"] = os.pathsep.join(p for p in [drifted["PYTHONPATH"], env.get("PYTHONPATH")] if p)
    rerun = run_cli(["rerun", original["mlflow_run_id"], "--allow-drift", "--json"], drifted)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    failing = run_cli(run_args(
        "tests/integration/workloads/exit_at_step.py", ["--exit-at-step", "3"], "usage-nlp", "bob",
        "--set", "fault_tolerance.max_restarts=0",
    ), env)
    assert failing.returncode == 1, failing.stderr[-4000:]
    return {"env": env, "original": original, "rerun": summary_of(rerun), "failed": summary_of(failing),
            "client": MlflowClient(original["tracking_uri"]), "uri": original["tracking_uri"], "folder": folder}


def recorded_totals(runs) -> dict[str, dict]:
    """Per team, straight from MLflow: device-hours, wasted hours and failed attempts by outcome."""
    client = runs["client"]
    experiment = client.get_experiment_by_name("usage").experiment_id
    totals: dict[str, dict] = {}
    for run in client.search_runs([experiment]):
        if "mlflow.parentRunId" in run.data.tags:
            continue
        team = totals.setdefault(run.data.tags["team"], {"runs": 0, "device_hours": 0.0, "wasted": 0.0, "failures": {}})
        team["runs"] += 1
        team["device_hours"] += run.data.metrics["device_hours"]
        team["wasted"] += run.data.metrics["wasted_device_hours"]
        for child in client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{run.info.run_id}'"):
            outcome = child.data.tags["outcome"]
            if outcome != "SUCCEEDED":
                team["failures"][outcome] = team["failures"].get(outcome, 0) + 1
    return totals


def test_usage_totals_equal_the_sums_over_the_mlflow_runs(runs):
    expected = recorded_totals(runs)
    assert expected["usage-vision"]["runs"] == 2 and expected["usage-nlp"]["runs"] == 1
    assert expected["usage-vision"]["failures"] == {"CRASHED": 1} and sum(expected["usage-nlp"]["failures"].values()) == 1
    picture = runs["folder"] / "usage.png"
    base = ["usage", "--by", "team", "--since", "1d", "--tracking-uri", runs["uri"], "--plot", str(picture)]

    as_json = run_cli([*base, "--json"], runs["env"])
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    report = summary_of(as_json)
    groups = {g["group"]: g for g in report["groups"]}
    for team, figures in expected.items():
        assert groups[team]["runs"] == figures["runs"]
        assert groups[team]["device_hours"] == pytest.approx(figures["device_hours"], abs=1e-6)
        assert groups[team]["wasted_device_hours"] == pytest.approx(figures["wasted"], abs=1e-6)
        assert groups[team]["failures"] == figures["failures"]
    assert report["total"]["device_hours"] == pytest.approx(sum(f["device_hours"] for f in expected.values()), abs=1e-6)
    assert groups["usage-vision"]["succeeded"] == 2 and groups["usage-nlp"]["success_rate"] == 0.0
    assert groups["usage-vision"]["checkpoint_bytes"] > 0  # both vision runs kept checkpoints
    assert groups["usage-vision"]["peak_devices"] == 2  # the runs ran one after the other, 2 devices each
    assert report["limits_checked"] is True and groups["usage-vision"]["device_limit"] is None  # no quota set
    assert picture.read_bytes()[:4] == b"\x89PNG"

    as_csv = run_cli([*base, "--csv"], runs["env"])
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(as_csv.stdout))}
    for team, figures in expected.items():
        assert float(rows[team]["device_hours"]) == pytest.approx(figures["device_hours"], abs=1e-6)
        assert float(rows[team]["wasted_device_hours"]) == pytest.approx(figures["wasted"], abs=1e-6)
        assert rows[team]["failures"] == ";".join(f"{k}={v}" for k, v in sorted(figures["failures"].items()))

    as_text = run_cli(base, runs["env"])
    lines = {line.split()[0]: line for line in as_text.stdout.splitlines() if line.split()}
    for team, figures in expected.items():
        assert f"{figures['device_hours']:.4f}" in lines[team], lines[team]
        for kind, count in figures["failures"].items():
            assert f"{kind} {count}" in lines[team]
    assert f"{sum(f['device_hours'] for f in expected.values()):.4f}" in lines["total"]


def audit(runs, run_id: str) -> tuple[str, dict]:
    text = run_cli(["audit", run_id, "--tracking-uri", runs["uri"]], runs["env"])
    as_json = run_cli(["audit", run_id, "--tracking-uri", runs["uri"], "--json"], runs["env"])
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr[-3000:] + as_json.stderr[-3000:]
    return text.stdout, summary_of(as_json)


def test_audit_of_a_cli_run_names_who_launched_it_and_holds_no_secret(runs):
    original = runs["original"]
    text, trail = audit(runs, original["mlflow_run_id"])
    recorded = runs["client"].get_run(original["mlflow_run_id"]).data.tags
    assert trail["origin"]["launched_via"] == "cli" and "prefect_deployment" not in trail["origin"]
    assert trail["origin"]["launched_by_user"] and trail["origin"]["launched_from_host"] == os.uname().nodename
    assert trail["identity"]["spec_hash"] == recorded["spec_hash"] and (trail["team"], trail["owner"]) == ("usage-vision", "ada")
    assert [(a["attempt"], a["outcome"]) for a in trail["attempts"]] == [(1, "CRASHED"), (2, "SUCCEEDED")]
    assert trail["reruns"] == [runs["rerun"]["mlflow_run_id"]]
    events = [e["event"] for e in trail["events"]]
    assert "trainflow.attempt.failed" in events and "trainflow.run.succeeded" in events
    assert "prefect.flow-run.Completed" in events
    assert f"launched via cli by {trail['origin']['launched_by_user']}" in text
    assert f"spec_hash: {recorded['spec_hash']}" in text
    recorded_params = runs["client"].get_run(original["mlflow_run_id"]).data.params
    for secret in [SECRET_VALUE, runs["env"]["AWS_ACCESS_KEY_ID"], runs["env"]["AWS_SECRET_ACCESS_KEY"]]:
        assert secret not in text and secret not in json.dumps(trail), secret
        assert secret not in json.dumps(recorded) and secret not in json.dumps(recorded_params), secret


def test_audit_of_a_rerun_with_drift_allowed_shows_the_override(runs):
    text, trail = audit(runs, runs["rerun"]["run_id"])  # by trainflow run id this time
    assert trail["mlflow_run_id"] == runs["rerun"]["mlflow_run_id"]
    assert trail["rerun"] == {"rerun_of": runs["original"]["mlflow_run_id"], "rerun_drift": "true",
                              "rerun_allow_drift": "true"}
    assert any(PROBE in line for line in trail["drift"]), trail["drift"]
    assert trail["origin"]["launched_via"] == "cli"
    assert f"rerun of {runs['original']['mlflow_run_id']}: drift true, --allow-drift given" in text


def test_audit_of_an_unknown_run_is_bad_input(runs):
    result = run_cli(["audit", "no-such-run", "--tracking-uri", runs["uri"]], runs["env"])
    assert result.returncode == 2 and "RUN_ID 'no-such-run'" in result.stderr
