"""`trainflow run` and `trainflow rerun`: a training job through its whole lifecycle."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from trainflow.cli.output import fail_input, finish, live_progress
from trainflow.cli.quota import quota_problem
from trainflow.cli.signals import orchestrating
from trainflow.run_id import new_run_id
from trainflow.runspec import SpecError, load_spec


def run(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Run spec (YAML).")],
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a spec field: key.path=value (repeatable).")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest verified checkpoint.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the run summary.")] = False,
) -> None:
    """Run a training job through its whole lifecycle."""
    from trainflow.preflight import preflight

    try:
        spec = load_spec(spec_path, overrides or [])
        preflight(spec, resume=resume)
    except SpecError as exc:
        fail_input(str(exc), as_json)

    with orchestrating():
        problem = quota_problem(spec)
        if problem:
            fail_input(problem, as_json)
        run_id = new_run_id(spec)
        with head_start(spec, run_id):
            from flows.lifecycle import training_lifecycle

            with live_progress():
                state = training_lifecycle(spec, resume=resume, run_id=run_id, return_state=True)
    finish(state, as_json)


def head_start(spec, run_id: str):
    """What the backend can start for the run while the orchestrator imports and plans (the local
    backend's standby interpreter), handed to its provisioning; ended with the command if not taken."""
    from trainflow.backends import launcher_for
    from trainflow.backends.abilities import StartsAhead

    launcher = launcher_for(spec)
    return launcher.head_start(spec, run_id) if isinstance(launcher, StartsAhead) else nullcontext()


def rerun(
    mlflow_run_id: Annotated[str, typer.Argument(metavar="MLFLOW_RUN_ID", help="The run to repeat.")],
    allow_drift: Annotated[
        bool, typer.Option("--allow-drift", help="Run even if code or environment differ; record the drift.")
    ] = False,
    tracking_uri: Annotated[
        str | None, typer.Option("--tracking-uri", help="Where the run is recorded (default: TRAINFLOW_HOME's).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the run summary.")] = False,
) -> None:
    """Repeat a recorded run with its recorded spec and seed; refuse (exit 2) if code or environment drifted."""
    from trainflow.home import default_tracking_uri
    from trainflow.preflight import preflight
    from trainflow.repro.environment import EnvironmentMismatch
    from trainflow.repro.rerun import RerunError, check_rerun, load_recorded_run, refusal

    tracking_uri = tracking_uri or default_tracking_uri()
    try:
        recorded = load_recorded_run(mlflow_run_id, tracking_uri)
        drift = check_rerun(recorded)
        preflight(recorded.spec)
    except (RerunError, SpecError, EnvironmentMismatch) as exc:
        fail_input(str(exc), as_json)
    if drift and not allow_drift:
        fail_input(refusal(recorded, drift), as_json)

    with orchestrating():
        problem = quota_problem(recorded.spec)
        if problem:
            fail_input(problem, as_json)
        from flows.rerun import rerun_training

        with live_progress():
            state = rerun_training(mlflow_run_id, allow_drift=allow_drift, tracking_uri=tracking_uri, return_state=True)
    finish(state, as_json)


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(rerun)
