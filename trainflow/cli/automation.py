"""`trainflow automation install`: Prefect automations for trainflow's events."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from trainflow.cli.output import fail_input

automation_app = typer.Typer(no_args_is_help=True, help="Prefect automations for trainflow's events.")


@automation_app.command("install")
def automation_install(
    webhook_url: Annotated[
        str | None, typer.Option("--webhook-url", help="POST each failure as JSON {subject, text} to this URL.")
    ] = None,
    block: Annotated[
        str | None,
        typer.Option("--block", help="A notification block you configured, as TYPE/NAME (e.g. slack-webhook/ml-team)."),
    ] = None,
    name: Annotated[
        str, typer.Option("--name", help="Name of the automation (replaced if it exists).")
    ] = "trainflow-failures",
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: what was installed.")] = False,
) -> None:
    """Notify on every failed attempt and failed run, through a webhook or a notification block."""
    from trainflow.prefect.automation import AutomationError, install

    try:
        installed = install(name=name, webhook_url=webhook_url, block=block)
    except AutomationError as exc:
        fail_input(str(exc), as_json)
    typer.echo(
        f"automation {installed['name']} ({installed['automation_id']}) notifies through {installed['block']} "
        f"on {', '.join(installed['events'])}"
    )
    if as_json:
        typer.echo(json.dumps(installed))


def register(app: typer.Typer) -> None:
    app.add_typer(automation_app, name="automation")
