"""An audit trail as text: who launched the run and how, what it was, what came of it, what Prefect saw."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from trainflow.reporting.audit import AuditTrail

PAYLOAD_CHARS = 160  # Prefect's own events' payloads (whole states) are cut to this for the one line they get
OWN_EVENTS = "trainflow."  # trainflow's events are printed whole: their payload is what happened


def _clock(ms: int | None) -> str:
    if not ms:
        return "–"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_trail(trail: AuditTrail) -> str:
    origin = trail.origin
    via = origin.get("launched_via", "not recorded (a run from before audit tags)")
    if origin.get("prefect_deployment"):
        via += f" {origin['prefect_deployment']}"
    lines = [
        f"run {trail.run_id or '?'} (MLflow {trail.mlflow_run_id}, experiment {trail.experiment})",
        f"  launched via {via} by {origin.get('launched_by_user', '?')} on {origin.get('launched_from_host', '?')}",
        f"  owner {trail.owner or '–'}, team {trail.team or '–'}",
        f"  started {_clock(trail.started_at)}, ended {_clock(trail.ended_at)}, MLflow status {trail.mlflow_status}",
    ]
    identity = trail.identity
    for key in (
        "status",
        "reason",
        "spec_hash",
        "git_commit",
        "git_dirty",
        "env_fingerprint",
        "workload_sha256",
        "prefect_flow_run_id",
    ):
        if key in identity:
            lines.append(f"  {key}: {identity[key]}")
    if trail.rerun:
        allowed = trail.rerun.get("rerun_allow_drift", "false") == "true"
        lines.append(
            f"  rerun of {trail.rerun['rerun_of']}: drift {trail.rerun.get('rerun_drift', '?')}, "
            f"--allow-drift {'given' if allowed else 'not given'}"
        )
        lines += [f"    drift: {line}" for line in trail.drift]
    if trail.reruns:
        lines.append(f"  rerun since by: {', '.join(trail.reruns)}")
    lines.append("  params: " + ", ".join(f"{k}={v}" for k, v in sorted(trail.params.items())))
    lines.append("attempts:")
    for a in trail.attempts:
        lines.append(
            f"  {a.attempt}: {a.outcome}, world size {a.world_size}, steps {a.resumed_from_step} → "
            f"{a.last_step} (MLflow {a.mlflow_run_id}){': ' + a.reason if a.reason else ''}"
        )
    if not trail.attempts:
        lines.append("  none recorded")
    lines.append(f"Prefect events: {trail.events_note}")
    for event in trail.events:
        payload = json.dumps(event.payload, default=str)
        if not event.event.startswith(OWN_EVENTS) and len(payload) > PAYLOAD_CHARS:
            payload = payload[: PAYLOAD_CHARS - 3] + "..."
        lines.append(f"  {event.occurred}  {event.event}  {event.resource}  {payload}")
    return "\n".join(lines)
