"""Read-only calls to the Prefect REST API at PREFECT_API_URL, for reports that work without one:
a team's device limit (a global concurrency limit) and the events about a flow run.

Plain HTTP, not the Prefect client: reports run outside any flow and must not start a server.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta

from trainflow.quota import LIMIT_PREFIX as TEAM_LIMIT_PREFIX  # the limit holding a team's device quota

TIMEOUT_S = 10
EVENT_PAGE_SIZE = 50  # the most the server returns per page
EVENT_PAGES = 20  # at most this many pages of events per flow run


class PrefectApiError(RuntimeError):
    """No Prefect server answered, or it refused the request."""


def api_url() -> str | None:
    return os.environ.get("PREFECT_API_URL") or None


def _call(url: str, body: dict | None = None):
    """The JSON answer, None for 404; PrefectApiError when nothing answers or the server refuses."""
    request = urllib.request.Request(
        url,
        method="POST" if body is not None else "GET",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise PrefectApiError(f"{url}: HTTP {exc.code} {exc.read()[:300]!r}") from None
    except (OSError, ValueError) as exc:
        raise PrefectApiError(f"{url}: {exc}") from None


def unreachable_server() -> str | None:
    """Why PREFECT_API_URL's server cannot run a flow (nothing answers there), or None (the variable
    unset: a temporary server is started instead). Any HTTP answer counts: a server that wants an
    API key (Prefect Cloud) refuses a health check without one."""
    api = api_url()
    if not api:
        return None
    try:
        with urllib.request.urlopen(f"{api.rstrip('/')}/health", timeout=TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as exc:
        reason = str(getattr(exc, "reason", exc))
    return (
        f"PREFECT_API_URL: no Prefect server answers at {api} ({reason}); start it, or unset "
        "PREFECT_API_URL to use a temporary server"
    )


def team_limits(api: str, teams: list[str]) -> dict[str, int]:
    """Each team's device limit where a `trainflow-team-<team>` limit exists."""
    limits = {}
    for team in teams:
        found = _call(f"{api.rstrip('/')}/v2/concurrency_limits/{urllib.parse.quote(TEAM_LIMIT_PREFIX + team)}")
        if found is not None:
            limits[team] = int(found["limit"])
    return limits


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat()


def flow_run_events(api: str, flow_run_id: str, since: float) -> list[dict]:
    """Every event about the flow run or naming it as related (its task runs, trainflow's events),
    oldest first."""
    body = {
        "filter": {
            "any_resource": {"id": [f"prefect.flow-run.{flow_run_id}"]},
            "occurred": {"since": _iso(since - 3600), "until": (datetime.now(UTC) + timedelta(hours=1)).isoformat()},
            "order": "ASC",
        },
        "limit": EVENT_PAGE_SIZE,
    }
    page = _call(f"{api.rstrip('/')}/events/filter", body) or {}
    events = list(page.get("events", []))
    for _ in range(EVENT_PAGES - 1):
        if not page.get("next_page"):
            break
        page = _call(page["next_page"]) or {}
        events += page.get("events", [])
    return events
