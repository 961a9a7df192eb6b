"""`trainflow` command: thin over the flows.

Exit codes: 0 success, 1 the training failed (reason printed), 2 bad input (nothing provisioned).
One module per group of subcommands, each registering itself here; torch, Prefect and MLflow are
imported inside the commands that need them, so `trainflow --help` and bad input stay fast.
"""

from __future__ import annotations

import sys

import typer

from trainflow.cli import automation, bench, drills, render, run, usage
from trainflow.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, show_usage_error
from trainflow.cli.quota import quota_app

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "app", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def trainflow() -> None:
    """Run distributed PyTorch training jobs as Prefect flows, recorded in MLflow."""


run.register(app)  # trainflow run, trainflow rerun
app.add_typer(quota_app, name="quota")
automation.register(app)
render.register(app)
drills.register(app)  # trainflow drill, trainflow soak
bench.register(app)
usage.register(app)  # trainflow usage, trainflow audit


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as error:  # bad arguments or options: no command ran
        show_usage_error(error, as_json="--json" in sys.argv[1:])
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("trainflow: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
