"""What every command prints: bad input as one line (exit 2), a lifecycle's summary and exit code,
live progress on a terminal."""

from __future__ import annotations

import json
import os
import sys
import threading
from contextlib import contextmanager
from typing import NoReturn

import typer

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def fail_input(message: str, as_json: bool = False) -> None:
    """Bad input: one line on stderr, exit 2; with `--json`, stdout still ends with one JSON line,
    `{"status": "invalid", "error": ...}`, for whatever reads it."""
    typer.echo(f"trainflow: {message}", err=True)
    if as_json:
        typer.echo(json.dumps({"status": "invalid", "error": message}))
    raise typer.Exit(EXIT_BAD_INPUT)


def show_usage_error(error: typer.TyperException, as_json: bool) -> NoReturn:
    """Arguments or options a command does not take: one line naming them and where the command's help
    is, the exit code typer gives (2); with `--json`, the same JSON line as `fail_input`. A command
    group called with nothing shows its help, as typer does."""
    ctx = getattr(error, "ctx", None)
    if type(error).__name__ == "NoArgsIsHelpError":  # typer's class for it is private
        error.show()  # type: ignore[attr-defined]
        sys.exit(error.exit_code)
    message = error.format_message().rstrip(".")
    where = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
    typer.echo(f"trainflow: {message}{where}", err=True)
    if as_json:
        typer.echo(json.dumps({"status": "invalid", "error": f"{message}{where}"}))
    sys.exit(error.exit_code)


@contextmanager
def live_progress():
    """A progress bar (step, loss, attempt, ETA) on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    from trainflow.orchestrator.progress import draw_while

    running = threading.Event()
    running.set()
    drawer = threading.Thread(target=draw_while, args=(running,), daemon=True)
    drawer.start()
    try:
        yield
    finally:
        running.clear()
        drawer.join(2)


def finish(state, as_json: bool) -> None:
    """Print the summary a lifecycle state carries and exit with its code."""
    summary = state.result(raise_on_failure=False)
    if not isinstance(summary, dict):
        typer.echo(f"trainflow: the lifecycle crashed: {state.message}", err=True)
        raise typer.Exit(EXIT_FAILED)
    if summary["status"] == "refused":  # a rerun whose code or environment drifted: nothing ran
        fail_input(summary["reason"], as_json)
    print_summary(summary)
    if as_json:
        from trainflow.contracts import RunSummary

        typer.echo(json.dumps(RunSummary.model_validate(summary).as_json_dict()))
    raise typer.Exit(0 if summary["status"] == "succeeded" else EXIT_FAILED)


def print_summary(summary: dict) -> None:
    from trainflow.reporting.summary import closing_lines

    typer.echo()
    for line in closing_lines(summary, _prefect_ui_url()):
        typer.echo(line)


def _prefect_ui_url() -> str | None:
    """The UI of the Prefect server named by PREFECT_API_URL; None when the run had a temporary one."""
    if not os.environ.get("PREFECT_API_URL"):
        return None
    from prefect.settings import PREFECT_UI_URL

    return PREFECT_UI_URL.value()
