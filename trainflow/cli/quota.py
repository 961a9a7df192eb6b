"""`trainflow quota`: set, list and delete team quotas on the shared Prefect server."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from trainflow.quota import TEMPORARY_SERVER_ENV, QuotaError, QuotaNeed, limit_name
from trainflow.runspec import RunSpec

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

quota_app = typer.Typer(no_args_is_help=True, help="Team quotas: devices a team's runs may hold at once.")


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    typer.echo(f"trainflow: {message}", err=True)
    raise typer.Exit(code)


def _server_needed() -> None:
    if not os.environ.get("PREFECT_API_URL"):
        _fail("quota: PREFECT_API_URL is not set; quotas live on the Prefect server the runs share")


def _team_limit(team: str) -> str:
    try:
        return limit_name(team)
    except QuotaError as exc:
        _fail(str(exc))


def _api():
    from trainflow.prefect import concurrency_limits  # Prefect's client only for the commands that talk to the server

    return concurrency_limits


@contextmanager
def _server_answers() -> Iterator[None]:
    """Bad input exits 2; a server that cannot be reached or refuses exits 1, saying which."""
    import httpx

    try:
        yield
    except QuotaError as exc:
        _fail(str(exc))
    except httpx.HTTPError as exc:
        _fail(f"quota: the Prefect server at {os.environ.get('PREFECT_API_URL')} did not answer: {exc}", EXIT_FAILED)


@quota_app.command("set")
def quota_set(
    team: Annotated[str, typer.Argument(metavar="TEAM", help="The team (its runs' tracking.tags.team).")],
    devices: Annotated[int, typer.Option("--devices", help="Devices the team's runs may hold at once.")],
) -> None:
    """Create or resize a team's quota (a global concurrency limit named trainflow-team-TEAM)."""
    _server_needed()
    name = _team_limit(team)
    with _server_answers():
        _api().set_limit(name, devices)
    typer.echo(f"quota {name}: {devices} devices")


@quota_app.command("list")
def quota_list(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list instead of a table.")] = False,
) -> None:
    """Every team quota: its limit, the devices its runs hold now, and how many of those are held by
    runs that no longer exist (stale: `trainflow quota repair` gives them back)."""
    _server_needed()
    with _server_answers():
        limits, stale = _limits_and_stale()
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "team": limit.team,
                        "limit": limit.name,
                        "devices": limit.devices,
                        "held": limit.held,
                        "stale": _stale_of(stale, limit.name),
                        "active": limit.active,
                    }
                    for limit in limits
                ]
            )
        )
        return
    if not limits:
        typer.echo("no team quotas: every team is unlimited (trainflow quota set TEAM --devices N)")
        return
    typer.echo(f"{'TEAM':<20} {'LIMIT':<32} {'DEVICES':>7} {'HELD':>5} {'STALE':>5}")
    for limit in limits:
        inactive = "" if limit.active else "  (inactive: not enforced)"
        count = _stale_of(stale, limit.name)
        typer.echo(
            f"{limit.team:<20} {limit.name:<32} {limit.devices:>7} {limit.held:>5} "
            f"{'?' if count is None else count:>5}{inactive}"
        )
    if stale is not None and any(s.stale for s in stale.values()):
        typer.echo("stale: held by runs that no longer exist; `trainflow quota repair` gives them back")


def _limits_and_stale():
    """The limits, and per limit the devices no holding run accounts for (None: unknown). The runs are
    read before the limits: a run giving its devices back in between is then still counted as
    holding them, never its devices as stale."""
    from trainflow.quota import stale_slots

    holders = _api().holding_runs()
    limits = _api().list_limits()
    return limits, stale_slots({limit.name: limit.held for limit in limits}, holders)


def _stale_of(stale, name: str) -> int | None:
    return None if stale is None else stale[name].stale


@quota_app.command("repair")
def quota_repair(
    team: Annotated[str | None, typer.Argument(metavar="[TEAM]", help="One team (default: every team).")] = None,
) -> None:
    """Give back the devices a team's quota counts as held by runs that no longer exist (a lease the
    server lost in a restart, a release that never reached it)."""
    _server_needed()
    name = _team_limit(team) if team else None
    with _server_answers():
        limits, stale = _limits_and_stale()
        if name is not None and name not in {limit.name for limit in limits}:
            _fail(f"quota {name}: there is no such quota (trainflow quota list)")
        if stale is None:
            _fail(
                "quota: a holding run's spec cannot be read, so no held device can be called stale; nothing given back",
                EXIT_FAILED,
            )
        repaired = [s for s in stale.values() if s.stale and name in (None, s.limit)]
        for slots in repaired:
            _api().give_back_slots(slots.limit, slots.stale)
            typer.echo(
                f"quota {slots.limit}: gave back {slots.stale} of {slots.held} held devices "
                f"(its runs hold {slots.held_by_runs})"
            )
    if not repaired:
        typer.echo("quota: nothing to repair: every held device belongs to a run that holds it")


@quota_app.command("delete")
def quota_delete(team: Annotated[str, typer.Argument(metavar="TEAM", help="The team.")]) -> None:
    """Remove a team's quota: its runs are no longer limited."""
    _server_needed()
    name = _team_limit(team)
    with _server_answers():
        deleted = _api().delete_limit(name)
    if not deleted:
        _fail(f"quota {name}: there is no such quota (trainflow quota list)")
    typer.echo(f"quota {name} deleted: team {team} is unlimited")


def quota_problem(spec: RunSpec) -> str | None:
    """Why `spec` can never run under its team's quota (bad input), checked before anything is provisioned."""
    if os.environ.get(TEMPORARY_SERVER_ENV) or not os.environ.get("PREFECT_API_URL"):
        return None  # nothing is enforced on a temporary server
    try:
        need = QuotaNeed.of(spec)
    except QuotaError as exc:
        return str(exc)
    limit = _api().read_limit(need.limit)
    if limit is None or not limit.active:
        return None
    return need.too_large(limit.devices)
