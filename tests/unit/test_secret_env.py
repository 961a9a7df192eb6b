"""workload.secret_env: names only in the spec, every name set before anything is provisioned."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from trainflow.backends.worker import SecretUnavailable, secret_environment
from trainflow.cli import EXIT_BAD_INPUT, app
from trainflow.preflight import preflight
from trainflow.runspec import SpecError, load_spec

SPEC = ROOT / "examples" / "digits" / "spec.yaml"


def test_names_are_recorded_values_are_not(monkeypatch):
    monkeypatch.setenv("TRAINFLOW_TEST_TOKEN", "value-never-in-the-spec")
    spec = load_spec(SPEC, ["workload.secret_env=[TRAINFLOW_TEST_TOKEN]"])
    assert spec.workload.secret_env == ["TRAINFLOW_TEST_TOKEN"]
    assert "value-never-in-the-spec" not in spec.model_dump_json()
    assert secret_environment(spec) == {"TRAINFLOW_TEST_TOKEN": "value-never-in-the-spec"}


@pytest.mark.parametrize("name", ["1ST", "WITH-DASH", "A B", "", "X=1"])
def test_a_name_that_cannot_be_a_variable_is_refused(name):
    with pytest.raises(SpecError, match="workload.secret_env"):
        load_spec(SPEC, [f"workload.secret_env=[{name!r}]"])


def test_an_unset_variable_is_refused_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.delenv("TRAINFLOW_TEST_UNSET", raising=False)
    spec = load_spec(SPEC, ["workload.secret_env=[TRAINFLOW_TEST_UNSET]"])
    with pytest.raises(SpecError, match="workload.secret_env: TRAINFLOW_TEST_UNSET not set"):
        preflight(spec)
    with pytest.raises(SecretUnavailable, match="TRAINFLOW_TEST_UNSET"):
        secret_environment(spec)
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["run", str(SPEC), "--set", "workload.secret_env=[TRAINFLOW_TEST_UNSET]"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "workload.secret_env: TRAINFLOW_TEST_UNSET not set in the orchestrator's environment" in result.output
    assert not (tmp_path / "home").exists()
