"""`trainflow rerun MLFLOW_RUN_ID`: the recorded spec and seed run again, bit for bit, as a new
MLflow run tagged rerun_of; refused (exit 2, nothing created) when the code or the environment
drifted from what the original recorded, unless --allow-drift. The original (a run that failed
over once) and its two reruns are the session's finished runs (finished_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tests.integration.conftest import run_cli
from tests.integration.deployments import api_json
from tests.integration.finished_runs import EXPERIMENT, PROBE, FinishedRuns, drifted_environment
from trainflow.repro.rerun import recorded_spec_sha256

pytestmark = pytest.mark.integration


def counts(runs: FinishedRuns) -> tuple[int, int]:
    """(MLflow runs in the experiment, Prefect flow runs): what a refused rerun must not change."""
    experiment = runs.client.get_experiment_by_name(EXPERIMENT)
    return len(runs.client.search_runs([experiment.experiment_id])), api_json(runs.api, "POST", "/flow_runs/count", {})


def test_rerun_repeats_the_recorded_run_bit_for_bit(finished_runs: FinishedRuns):
    first, summary = finished_runs.original, finished_runs.rerun
    assert summary["status"] == "succeeded"
    assert summary["mlflow_run_id"] != first["mlflow_run_id"]
    assert summary["rerun_of"] == first["mlflow_run_id"] and summary["drift"] == []
    assert summary["params_sha256"] == first["params_sha256"]

    client = finished_runs.client
    rerun, was = client.get_run(summary["mlflow_run_id"]), client.get_run(first["mlflow_run_id"])
    assert rerun.data.tags["rerun_of"] == first["mlflow_run_id"]
    assert rerun.data.tags["rerun_drift"] == "false"
    assert rerun.data.tags["params_sha256"] == was.data.tags["params_sha256"]
    for tag in ["spec_hash", "env_fingerprint", "git_commit", "workload_sha256"]:
        assert rerun.data.tags[tag] == was.data.tags[tag], tag
    assert rerun.data.params == was.data.params  # the recorded spec, seed included, not a re-parsed one
    verdict = f"no drift; params_sha256 {first['params_sha256']} = the original's"
    assert rerun.data.tags["rerun_verdict"] == verdict and rerun.data.tags["rerun_params_match_original"] == "true"
    # the verdict as the rerun's flow run shows it in Prefect (the drifted rerun's says its drift)
    artifacts = api_json(
        finished_runs.api,
        "POST",
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": [f"rerun-{first['mlflow_run_id']}"]}}},
    )
    [shown] = [a for a in artifacts if a["description"].startswith("no drift")]
    assert shown["description"] == verdict
    assert "| Drift | none |" in shown["data"] and "| Parameters match the original | true |" in shown["data"]


def test_rerun_refuses_a_drifted_environment_and_creates_nothing(finished_runs: FinishedRuns):
    before = counts(finished_runs)
    drifted = drifted_environment(finished_runs.env, finished_runs.folder)
    result = run_cli(["rerun", finished_runs.original["mlflow_run_id"], "--json"], drifted)
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert f"package {PROBE} 1.0 is installed here but was not in the recorded run" in result.stderr
    assert "--allow-drift" in result.stderr
    assert counts(finished_runs) == before


def test_rerun_refuses_changed_code_and_creates_nothing(finished_runs: FinishedRuns):
    script = finished_runs.script
    recorded = script.read_text()
    before = counts(finished_runs)
    try:
        script.write_text(recorded + "\n# an edit after the run was recorded\n")
        result = run_cli(["rerun", finished_runs.original["mlflow_run_id"]], finished_runs.env)
    finally:
        script.write_text(recorded)
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert f"code: the training script {script} changed" in result.stderr
    assert counts(finished_runs) == before


def test_rerun_that_its_teams_quota_can_never_hold_is_bad_input(finished_runs: FinishedRuns):
    env, team = finished_runs.env, "usage-vision"  # the original's team; its 2 nodes x 1 process need 2 devices
    before = counts(finished_runs)
    assert run_cli(["quota", "set", team, "--devices", "1"], env).returncode == 0
    try:
        result = run_cli(["rerun", finished_runs.original["mlflow_run_id"], "--json"], env)
    finally:
        assert run_cli(["quota", "delete", team], env).returncode == 0
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert result.stderr.strip().splitlines()[-1].startswith("trainflow: resources: the run needs 2 devices")
    assert counts(finished_runs) == before


def test_rerun_of_an_unknown_run_is_bad_input(finished_runs: FinishedRuns):
    result = run_cli(["rerun", "0" * 32], finished_runs.env)
    assert result.returncode == 2
    assert f"no MLflow run '{'0' * 32}'" in result.stderr


def test_allow_drift_runs_anyway_and_records_the_drift(finished_runs: FinishedRuns, tmp_path):
    first, summary = finished_runs.original, finished_runs.drifted_rerun
    assert summary["params_sha256"] == first["params_sha256"]
    client = finished_runs.client
    rerun = client.get_run(summary["mlflow_run_id"])
    assert rerun.data.tags["rerun_of"] == first["mlflow_run_id"]
    assert rerun.data.tags["rerun_drift"] == "true"
    drift = json.loads(open(client.download_artifacts(rerun.info.run_id, "rerun/drift.json", str(tmp_path))).read())
    assert any(PROBE in line for line in drift), drift


def _edited_spec_artifact(runs: FinishedRuns) -> tuple[Path, str, str]:
    """The original's recorded spec file, its text, and the text with another seed and step count."""
    run = runs.client.get_run(runs.original["mlflow_run_id"])
    path = Path(urlparse(run.info.artifact_uri).path) / "spec" / "resolved_spec.yaml"
    text = path.read_text()
    raw = yaml.safe_load(text)
    raw["seed"], raw["workload"]["steps"] = raw["seed"] + 1, 120
    return path, text, yaml.safe_dump(raw, sort_keys=False)


def test_rerun_refuses_a_recorded_spec_edited_after_the_run(finished_runs: FinishedRuns):
    path, recorded, edited = _edited_spec_artifact(finished_runs)
    before = counts(finished_runs)
    try:
        path.write_text(edited)
        result = run_cli(["rerun", finished_runs.original["mlflow_run_id"], "--json"], finished_runs.env)
    finally:
        path.write_text(recorded)
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    line = result.stderr.strip().splitlines()[-1]
    assert "spec/resolved_spec.yaml is not the spec it ran" in line and "is not the run's spec_hash" in line, line
    assert "steps: 120 in the spec, 10 in the run's params" in line, line
    assert counts(finished_runs) == before


def test_rerun_refuses_an_edited_spec_even_with_its_hash_tag_forged(finished_runs: FinishedRuns):
    """Tags can be rewritten after a run; its params cannot, and they still tell the edit."""
    client, run_id = finished_runs.client, finished_runs.original["mlflow_run_id"]
    path, recorded, edited = _edited_spec_artifact(finished_runs)
    true_hash = client.get_run(run_id).data.tags["spec_hash"]
    before = counts(finished_runs)
    try:
        path.write_text(edited)
        client.set_tag(run_id, "spec_hash", recorded_spec_sha256(yaml.safe_load(edited)))
        result = run_cli(["rerun", run_id], finished_runs.env)
    finally:
        path.write_text(recorded)
        client.set_tag(run_id, "spec_hash", true_hash)
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    line = result.stderr.strip().splitlines()[-1]
    assert "spec_hash" not in line and "seed: " in line and "steps: 120 in the spec, 10 in the run's params" in line, (
        line
    )
    assert counts(finished_runs) == before
