"""A run's audit trail (trainflow.reporting.audit) completed with the Prefect events of its flow run,
read from the server's REST API."""

from __future__ import annotations

from trainflow.prefect.rest import PrefectApiError, flow_run_events
from trainflow.reporting.audit import AuditTrail, EventTrail


def add_events(trail: AuditTrail, api: str | None) -> None:
    """The Prefect events of the run's flow run, when a server is reachable at `api`."""
    flow_run_id = trail.identity.get("prefect_flow_run_id")
    if not flow_run_id:
        trail.events_note = "the run recorded no Prefect flow run"
        return
    if not api:
        trail.events_note = "Prefect events not read: PREFECT_API_URL is not set"
        return
    try:
        events = flow_run_events(api, flow_run_id, since=trail.started_at / 1000)
    except PrefectApiError as exc:
        trail.events_note = f"Prefect events not read: {exc}"
        return
    trail.events = [
        # a task run by its name (watch-attempt-1), not its id
        EventTrail(
            e.get("occurred", ""),
            e.get("event", ""),
            (
                e.get("resource", {}).get("prefect.resource.name")
                or e.get("resource", {}).get("prefect.resource.id", "")
            ),
            e.get("payload") or {},
        )
        for e in events
    ]
    trail.events_note = f"{len(trail.events)} event(s) of flow run {flow_run_id}"
