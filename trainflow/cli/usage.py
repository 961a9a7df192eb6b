"""`trainflow usage` and `trainflow audit`: reports read from MLflow (and Prefect, when reachable);
they start no server and change nothing but the picture they write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

EXIT_BAD_INPUT = 2


def _fail_input(message: str) -> None:
    typer.echo(f"trainflow: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _store(tracking_uri: str | None) -> str:
    """The tracking URI to read; a local SQLite store that does not exist is bad input, not a new store."""
    from trainflow.home import default_tracking_uri

    uri = tracking_uri or default_tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        _fail_input(f"--tracking-uri {uri}: no MLflow store there (set TRAINFLOW_HOME or pass --tracking-uri)")
    return uri


def usage(
    by: Annotated[str, typer.Option("--by", help="Group by team, owner or experiment.")] = "team",
    since: Annotated[str, typer.Option("--since", help="Runs started in this period: 30d, 12h, 2w, 90m.")] = "30d",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    as_csv: Annotated[
        bool, typer.Option("--csv", help="Print the report as CSV, one row per group and a total.")
    ] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Where to write the PNG (default: TRAINFLOW_HOME/reports/).")
    ] = None,
    tracking_uri: Annotated[
        str | None, typer.Option("--tracking-uri", help="Where runs are recorded (default: TRAINFLOW_HOME's).")
    ] = None,
) -> None:
    """Device-hours, waste, failures, quota waits and checkpoint bytes per team, owner or experiment."""
    from trainflow.home import trainflow_home
    from trainflow.reporting.usage import GroupBy, UsageError, build_report, parse_since

    if as_json and as_csv:
        _fail_input("--json and --csv: choose one output format")
    try:
        grouping = GroupBy(by)
    except ValueError:
        _fail_input(f"--by {by!r}: choose team, owner or experiment")
    try:
        since_s = parse_since(since)
    except UsageError as exc:
        _fail_input(str(exc))
    from trainflow.reporting.plots.usage import render_usage
    from trainflow.reporting.usage_render import render_csv, render_text

    report = build_report(_store(tracking_uri), grouping, since_s)
    _compare_limits(report)
    picture = render_usage(report, plot or trainflow_home() / "reports" / f"usage-by-{grouping.value}.png")
    if as_json:
        typer.echo(json.dumps({**report.as_dict(), "picture": str(picture)}))
    elif as_csv:
        typer.echo(render_csv(report), nl=False)
        typer.echo(f"picture: {picture}", err=True)
    else:
        typer.echo(render_text(report))
        typer.echo(f"picture: {picture}")


def _compare_limits(report) -> None:
    """Each team's device limit beside its peak, when a Prefect server answers at PREFECT_API_URL."""
    from trainflow.prefect.rest import PrefectApiError, api_url, team_limits
    from trainflow.reporting.usage import GroupBy, compare_limits

    api = api_url()
    if not api or report.by != GroupBy.team:
        return
    try:
        compare_limits(report, team_limits(api, [g.group for g in report.groups]))
    except PrefectApiError:
        return


def audit(
    run_ref: Annotated[str, typer.Argument(metavar="RUN_ID", help="An MLflow run id or a trainflow run id.")],
    tracking_uri: Annotated[
        str | None, typer.Option("--tracking-uri", help="Where the run is recorded (default: TRAINFLOW_HOME's).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the trail as one JSON object.")] = False,
) -> None:
    """Who launched a run, from where and with what; its reruns, attempts and Prefect events."""
    from trainflow.prefect.audit_events import add_events
    from trainflow.prefect.rest import api_url
    from trainflow.reporting.audit import AuditError, read_trail
    from trainflow.reporting.audit_render import render_trail

    try:
        trail = read_trail(_store(tracking_uri), run_ref)
    except AuditError as exc:
        _fail_input(str(exc))
    add_events(trail, api_url())
    typer.echo(json.dumps(trail.as_dict(), default=str) if as_json else render_trail(trail))


def register(app: typer.Typer) -> None:
    app.command()(usage)
    app.command()(audit)
