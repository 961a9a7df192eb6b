"""`trainflow render SPEC -o DIR`: the manifests an attempt would create, offline, valid, and exit
code 2 for input it cannot render."""

from __future__ import annotations

import kubernetes_validate
import yaml
from typer.testing import CliRunner

from tests.conftest import ROOT
from trainflow.cli import EXIT_BAD_INPUT, app

EXAMPLE = ROOT / "examples" / "specs" / "digits-kubernetes.yaml"
runner = CliRunner()


def test_render_writes_the_attempts_manifests(tmp_path):
    result = runner.invoke(
        app, ["render", str(EXAMPLE), "-o", str(tmp_path), "--run-id", "digits-k8s-review", "--attempt", "2"]
    )
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00-service.yaml", "05-image-build-job.yaml", "10-worker-config.yaml", "20-job.yaml"]
    assert result.output.split() == [str(tmp_path / name) for name in names]
    for path in tmp_path.iterdir():
        doc = yaml.safe_load(path.read_text())
        kubernetes_validate.validate(doc, "1.34", strict=True)
        assert doc["metadata"]["labels"]["trainflow.dev/run"] == "digits-k8s-review"
    job = yaml.safe_load((tmp_path / "20-job.yaml").read_text())
    assert job["metadata"]["name"] == "digits-k8s-review-a2"
    assert job["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "registry.example.com/ml/trainflow:tf-cpu-"
    )
    assert "placeholders" in (tmp_path / "10-worker-config.yaml").read_text().splitlines()[0]


def test_render_with_overrides_picks_the_launch_api(tmp_path):
    result = runner.invoke(
        app,
        [
            "render",
            str(EXAMPLE),
            "-o",
            str(tmp_path),
            "--set",
            "kubernetes.launch_api=jobset",
            "--set",
            "kubernetes.image=registry.example.com/ml/trainflow:v7",
        ],
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00-service.yaml", "10-worker-config.yaml", "20-jobset.yaml"]


def test_render_refuses_a_local_spec(tmp_path):
    result = runner.invoke(app, ["render", str(ROOT / "examples" / "digits" / "spec.yaml"), "-o", str(tmp_path)])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "resources.backend is local" in result.output and not list(tmp_path.iterdir())


def test_render_refuses_a_kubernetes_spec_without_s3(tmp_path):
    result = runner.invoke(app, ["render", str(EXAMPLE), "-o", str(tmp_path), "--set", "checkpoint.uri=checkpoints/x"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "checkpoint.uri: the kubernetes backend needs an s3:// URI" in result.output


def test_render_writes_placeholders_never_secret_env_values(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf-value-never-rendered")
    result = runner.invoke(
        app, ["render", str(EXAMPLE), "-o", str(tmp_path), "--set", "workload.secret_env=[HF_TOKEN]"]
    )
    assert result.exit_code == 0, result.output
    assert not any("hf-value-never-rendered" in path.read_text() for path in tmp_path.iterdir())
    config = yaml.safe_load((tmp_path / "10-worker-config.yaml").read_text())
    assert config["stringData"]["env.HF_TOKEN"] == "set-by-the-orchestrator-at-launch-from-$HF_TOKEN"
