"""`trainflow` command: thin over the flows.

Exit codes: 0 success, 1 the training failed (reason printed), 2 bad input (nothing provisioned).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from trainflow.spec import SpecError, load_spec

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def trainflow() -> None:
    """Run distributed PyTorch training jobs as Prefect flows, recorded in MLflow."""


def fail_input(message: str) -> None:
    typer.echo(f"trainflow: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _stop_on_sigterm() -> None:
    """SIGTERM (a scheduler, `kill`) unwinds like Ctrl-C, so teardown still runs."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


@app.command()
def run(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Run spec (YAML).")],
    overrides: Annotated[
        Optional[list[str]], typer.Option("--set", help="Override a spec field: key.path=value (repeatable).")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest verified checkpoint.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the run summary.")] = False,
) -> None:
    """Run a training job through its whole lifecycle."""
    from trainflow.preflight import preflight

    try:
        spec = load_spec(spec_path, overrides or [])
        preflight(spec)
    except SpecError as exc:
        fail_input(str(exc))

    # The temporary server's telemetry writes race the flow's own writes to its SQLite database.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.lifecycle import training_lifecycle

    _stop_on_sigterm()
    state = training_lifecycle(spec, resume=resume, return_state=True)
    summary = state.result(raise_on_failure=False)
    if not isinstance(summary, dict):
        typer.echo(f"trainflow: the lifecycle crashed: {state.message}", err=True)
        raise typer.Exit(EXIT_FAILED)
    print_summary(summary)
    if as_json:
        typer.echo(json.dumps(summary, default=str))
    raise typer.Exit(0 if summary["status"] == "succeeded" else EXIT_FAILED)


def print_summary(summary: dict) -> None:
    echo = lambda text="": typer.echo(text, err=False)  # noqa: E731
    echo()
    echo(f"run {summary['run_id']}: {summary['status'].upper()} at step {summary['final_step']}/{summary['total_steps']}")
    if summary["status"] != "succeeded":
        echo(f"  reason: {summary['reason']}")
    if summary.get("final_loss") is not None:
        echo(f"  final loss {summary['final_loss']:.4f}, params sha256 {str(summary['params_sha256'])[:16]}...")
    for row in summary["attempts"]:
        echo(
            f"  attempt {row['attempt']}: {row['outcome']} (from step {row['resumed_from_step']} to {row['last_step']})"
        )
    if summary["checkpoints"]:
        echo(f"  latest checkpoint: {summary['checkpoints'][-1]['uri']}")
    echo(f"  teardown: {'clean' if summary['teardown']['clean'] else 'SURVIVORS ' + str(summary['teardown']['survivors'])}")
    echo(f"  MLflow: mlflow ui --backend-store-uri {summary['tracking_uri']}  (run {summary['mlflow_run_id']})")
    echo(f"  Prefect: flow run {summary['prefect_flow_run_id']}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("trainflow: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
