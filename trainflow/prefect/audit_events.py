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
    names = resource_names(events)
    trail.events = [
        EventTrail(
            e.get("occurred", ""),
            e.get("event", ""),
            names.get(_id(e.get("resource", {})), _id(e.get("resource", {}))),
            e.get("payload") or {},
        )
        for e in events
    ]
    trail.events_note = f"{len(trail.events)} event(s) of flow run {flow_run_id}"


def resource_names(events: list[dict]) -> dict[str, str]:
    """Each resource's newest name among the events, oldest first: as their resource or a related
    one. A task run is named by its task until it starts, then by its run name (watch-attempt-1); a
    flow run's or an artifact's later events may carry no name at all, and take the one given before."""
    names: dict[str, str] = {}
    for event in events:
        resource = event.get("resource", {})
        for named in (resource, *event.get("related", [])):
            if named.get("prefect.resource.name") and _id(named):
                names[_id(named)] = named["prefect.resource.name"]
        if event.get("event") == "prefect.artifact.created" and _id(resource) not in names:
            names[_id(resource)] = f"{(event.get('payload') or {}).get('type') or 'an'} artifact"
    return names


def _id(resource: dict) -> str:
    return resource.get("prefect.resource.id", "")
