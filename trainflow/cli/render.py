"""`trainflow render`: the manifests an attempt would create, written for review (no cluster needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainflow.cli.output import fail_input
from trainflow.runspec import SpecError, load_spec


def render(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Run spec (YAML) whose backend renders manifests.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Directory to write the manifests to.")],
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a spec field: key.path=value (repeatable).")
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id to name the objects by.")] = None,
    attempt: Annotated[int, typer.Option("--attempt", min=1, help="Attempt number.")] = 1,
) -> None:
    """Write the manifests an attempt would create (Kubernetes), for review or GitOps (no cluster needed)."""
    try:
        spec = load_spec(spec_path, overrides or [])
    except SpecError as exc:
        fail_input(str(exc))
    from trainflow.backends import launcher_for
    from trainflow.backends.abilities import RenderError, RendersManifests

    launcher = launcher_for(spec)
    if not isinstance(launcher, RendersManifests):
        fail_input(
            f"{spec_path}: resources.backend is {spec.resources.backend.value}, which has nothing to render "
            "(choose a backend that renders manifests)"
        )
    try:
        written = launcher.render(spec, out, run_id, attempt)
    except RenderError as exc:
        fail_input(str(exc))
    for path in written:
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command()(render)
