"""Finished real runs, made once per session for the modules that only read them (usage and audit,
reruns, the notebook and the run pictures). In one home's MLflow store, experiment `usage`:
- a CLI run of team usage-vision that fails over once (a secret in its workers' environment,
  checkpoints in S3), from a copy of its script that test_rerun may edit;
- a rerun of it (fault-free: the marker says it failed already), and a rerun with drift allowed;
- a run of team usage-nlp that fails."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.integration.conftest import run_cli, s3_environment, summary_of, unique_prefix

SECRET_NAME, SECRET_VALUE = "TRAINFLOW_AUDIT_SECRET", "audit-secret-value-never-recorded"
SPEC = "examples/digits/spec.yaml"
EXPERIMENT = "usage"
STEPS = 10
PROBE = "trainflow-drift-probe"
WORKLOADS = ROOT / "tests/integration/workloads"


@dataclass(frozen=True)
class FinishedRuns:
    env: dict[str, str]  # the `trainflow` environment the runs had (the secret included)
    folder: Path
    script: Path  # the original run's training script (a copy)
    original: dict  # `trainflow run --json` summary: CRASHED, then SUCCEEDED
    rerun: dict  # `trainflow rerun --json` summary of `original`: no drift
    drifted_rerun: dict  # `trainflow rerun --allow-drift --json` summary of `original`, in a drifted environment
    failed: dict  # `trainflow run --json` summary: failed, no restarts
    tracking_uri: str
    api: str  # the Prefect server the runs were recorded on

    @property
    def client(self) -> MlflowClient:
        return MlflowClient(self.tracking_uri)


def run_args(entrypoint: str, args: list[str], team: str, owner: str, *more: str) -> list[str]:
    return [
        "run",
        SPEC,
        "--set",
        f"workload.entrypoint={entrypoint}",
        "--set",
        f"workload.args={json.dumps(args)}",
        "--set",
        f"workload.steps={STEPS}",
        "--set",
        "checkpoint.every_steps=5",
        "--set",
        f"tracking.experiment={EXPERIMENT}",
        "--set",
        f"tracking.tags={json.dumps({'team': team, 'owner': owner})}",
        *more,
        "--json",
    ]


def drifted_environment(env: dict[str, str], folder: Path) -> dict[str, str]:
    """`env` plus one installed distribution (in `folder`) that a run recorded in `env` did not have."""
    site = folder / "extra-site"
    info = site / f"{PROBE.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 1.0\n")
    # the probe's folder goes before this checkout, not instead of it: the rerun must run this code
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in [str(site), env.get("PYTHONPATH")] if p)}


def make_finished_runs(folder: Path, prefect_api: str, s3_endpoint: str) -> FinishedRuns:
    """The runs, in `folder`; the session fixture `finished_runs` (conftest) makes them once."""
    env = {
        **os.environ,
        **s3_environment(s3_endpoint),
        "TRAINFLOW_HOME": str(folder / "home"),
        "PREFECT_API_URL": prefect_api,
        SECRET_NAME: SECRET_VALUE,
    }
    env.pop("AWS_PROFILE", None)
    workload = folder / "workload"
    workload.mkdir()
    for name in ("fail_once.py", "tiny_ddp.py"):  # the script and the job it imports from its folder
        shutil.copy(WORKLOADS / name, workload / name)
    script = workload / "fail_once.py"
    failing_over = run_cli(
        run_args(
            str(script),
            ["--fail-at-step", "5", "--marker", str(folder / "failed")],
            "usage-vision",
            "ada",
            "--set",
            f"workload.secret_env=[{SECRET_NAME}]",
            "--set",
            f"checkpoint.uri={unique_prefix()}",
        ),
        env,
    )
    assert failing_over.returncode == 0, failing_over.stderr[-4000:]
    original = summary_of(failing_over)
    rerun = run_cli(["rerun", original["mlflow_run_id"], "--json"], env)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    drifted = run_cli(["rerun", original["mlflow_run_id"], "--allow-drift", "--json"], drifted_environment(env, folder))
    assert drifted.returncode == 0, drifted.stderr[-4000:]
    failing = run_cli(
        run_args(
            "tests/integration/workloads/exit_at_step.py",
            ["--exit-at-step", "3"],
            "usage-nlp",
            "bob",
            "--set",
            "fault_tolerance.max_restarts=0",
        ),
        env,
    )
    assert failing.returncode == 1, failing.stderr[-4000:]
    return FinishedRuns(
        env=env,
        folder=folder,
        script=script,
        original=original,
        rerun=summary_of(rerun),
        drifted_rerun=summary_of(drifted),
        failed=summary_of(failing),
        tracking_uri=original["tracking_uri"],
        api=prefect_api,
    )
