"""`trainflow rerun MLFLOW_RUN_ID`: the recorded spec and seed run again, bit for bit, as a new
MLflow run tagged rerun_of; refused (exit 2, nothing created) when the code or the environment
drifted from what the original recorded, unless --allow-drift."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.integration.conftest import run_cli, summary_of
from tests.integration.deployments import api_json

pytestmark = pytest.mark.integration

PROBE = "trainflow-drift-probe"


@pytest.fixture(scope="module")
def original(tmp_path_factory, prefect_api):
    """A 30-step run of the reference workload, from a copy of its script this module can edit."""
    folder = tmp_path_factory.mktemp("rerun")
    script = folder / "train.py"
    shutil.copy(ROOT / "examples/digits/train.py", script)
    env = {**os.environ, "TRAINFLOW_HOME": str(folder / "home"), "PREFECT_API_URL": prefect_api}
    result = run_cli(
        ["run", "examples/digits/spec.yaml", "--set", f"workload.entrypoint={script}", "--set", "workload.steps=30",
         "--set", "checkpoint.every_steps=10", "--set", "tracking.experiment=reruns", "--json"],
        env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    client = MlflowClient(summary["tracking_uri"])
    return {"env": env, "script": script, "summary": summary, "client": client, "folder": folder}


def drifted_environment(original) -> dict[str, str]:
    """The same environment plus one installed distribution the original run did not have."""
    site = original["folder"] / "extra-site"
    info = site / f"{PROBE.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 1.0\n")
    return {**original["env"], "PYTHONPATH": str(site)}


def counts(original, prefect_api: str) -> tuple[int, int]:
    """(MLflow runs in the experiment, Prefect flow runs): what a refused rerun must not change."""
    client = original["client"]
    experiment = client.get_experiment_by_name("reruns")
    mlflow_runs = len(client.search_runs([experiment.experiment_id]))
    return mlflow_runs, api_json(prefect_api, "POST", "/flow_runs/count", {})


def test_rerun_repeats_the_recorded_run_bit_for_bit(original):
    first = original["summary"]
    result = run_cli(["rerun", first["mlflow_run_id"], "--json"], original["env"])
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert summary["status"] == "succeeded"
    assert summary["mlflow_run_id"] != first["mlflow_run_id"]
    assert summary["rerun_of"] == first["mlflow_run_id"] and summary["drift"] == []
    assert summary["params_sha256"] == first["params_sha256"]

    client = original["client"]
    rerun, was = client.get_run(summary["mlflow_run_id"]), client.get_run(first["mlflow_run_id"])
    assert rerun.data.tags["rerun_of"] == first["mlflow_run_id"]
    assert rerun.data.tags["rerun_drift"] == "false"
    assert rerun.data.tags["params_sha256"] == was.data.tags["params_sha256"]
    for tag in ["spec_hash", "env_fingerprint", "git_commit", "workload_sha256"]:
        assert rerun.data.tags[tag] == was.data.tags[tag], tag
    assert rerun.data.params == was.data.params  # the recorded spec, seed included, not a re-parsed one


def test_rerun_refuses_a_drifted_environment_and_creates_nothing(original, prefect_api):
    before = counts(original, prefect_api)
    result = run_cli(["rerun", original["summary"]["mlflow_run_id"], "--json"], drifted_environment(original))
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert f"package {PROBE} 1.0 is installed here but was not in the recorded run" in result.stderr
    assert "--allow-drift" in result.stderr
    assert counts(original, prefect_api) == before


def test_rerun_refuses_changed_code_and_creates_nothing(original, prefect_api):
    script = original["script"]
    recorded = script.read_text()
    before = counts(original, prefect_api)
    try:
        script.write_text(recorded + "\n# an edit after the run was recorded\n")
        result = run_cli(["rerun", original["summary"]["mlflow_run_id"]], original["env"])
    finally:
        script.write_text(recorded)
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert f"code: the training script {script} changed" in result.stderr
    assert counts(original, prefect_api) == before


def test_rerun_of_an_unknown_run_is_bad_input(original):
    result = run_cli(["rerun", "0" * 32], original["env"])
    assert result.returncode == 2
    assert f"no MLflow run '{'0' * 32}'" in result.stderr


def test_allow_drift_runs_anyway_and_records_the_drift(original):
    first = original["summary"]
    result = run_cli(["rerun", first["mlflow_run_id"], "--allow-drift", "--json"], drifted_environment(original))
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert summary["params_sha256"] == first["params_sha256"]
    client = original["client"]
    rerun = client.get_run(summary["mlflow_run_id"])
    assert rerun.data.tags["rerun_of"] == first["mlflow_run_id"]
    assert rerun.data.tags["rerun_drift"] == "true"
    drift = json.loads(open(client.download_artifacts(rerun.info.run_id, "rerun/drift.json")).read())
    assert any(PROBE in line for line in drift), drift
