"""`trainflow bench`: measure trainflow's parts on this machine."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from trainflow.cli.output import fail_input

bench_app = typer.Typer(no_args_is_help=True, help="Measure trainflow's parts on this machine.")


@bench_app.command("checkpoint")
def bench_checkpoint(
    size_mb: Annotated[int, typer.Option("--size-mb", help="Checkpoint size (parameters + momentum), MiB.")] = 64,
    uri: Annotated[
        Optional[str], typer.Option("--uri", help="s3://bucket/prefix to use (default: start an own moto_server).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the figures.")] = False,
) -> None:
    """Stall of sync vs async saves, local/S3 throughput vs plain boto3, verify time, step overhead."""
    from trainflow.drills.bench.checkpoint import BenchError, Options, render, run_benchmark

    try:
        figures = run_benchmark(Options(size_mb=size_mb, uri=uri), log=lambda text: typer.echo(text, err=True))
    except BenchError as exc:
        fail_input(str(exc), as_json)
    typer.echo(render(figures))
    if as_json:
        typer.echo(json.dumps(figures))


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
