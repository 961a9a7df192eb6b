"""`trainflow bench`: measure trainflow's parts on this machine."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from trainflow.cli.output import fail_input

bench_app = typer.Typer(no_args_is_help=True, help="Measure trainflow's parts on this machine.")


@bench_app.command("checkpoint")
def bench_checkpoint(
    size_mb: Annotated[int, typer.Option("--size-mb", help="Checkpoint size (parameters + momentum), MiB.")] = 64,
    uri: Annotated[
        str | None, typer.Option("--uri", help="s3://bucket/prefix to use (default: start an own moto_server).")
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


@bench_app.command("scale")
def bench_scale(
    ranks: Annotated[int, typer.Option("--ranks", help="Synthetic ranks, 8 per node.")] = 1024,
    steps_per_s: Annotated[float, typer.Option("--steps-per-s", help="Steps every rank takes per second.")] = 1.0,
    seconds: Annotated[float, typer.Option("--seconds", help="Seconds of steps before a node goes silent.")] = 20.0,
    heartbeat_timeout_s: Annotated[
        float, typer.Option("--heartbeat-timeout-s", help="The watcher's fault_tolerance.heartbeat_timeout_s.")
    ] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the figures.")] = False,
) -> None:
    """The status channel at scale: synthetic ranks through the real node relay code against the
    real orchestrator side (its own process): set-up, CPU, step apply latency, a silent node found."""
    from trainflow.drills.bench.scale import BenchError, Options, run_benchmark

    try:
        figures = run_benchmark(
            Options(ranks=ranks, steps_per_s=steps_per_s, seconds=seconds, heartbeat_timeout_s=heartbeat_timeout_s),
            log=lambda text: typer.echo(text, err=True),
        )
    except BenchError as exc:
        fail_input(str(exc))
    if as_json:
        typer.echo(json.dumps(figures))
    else:
        typer.echo("\n".join(f"{key}: {value}" for key, value in figures.items()))


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
