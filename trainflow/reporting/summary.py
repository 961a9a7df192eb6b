"""The run summary's status and the closing lines `trainflow run` prints: every figure is the run
ledger's, and every command printed works as printed."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from trainflow.contracts import AttemptResult, Outcome, RunSummary
from trainflow.contracts.ledger import percent, seconds

# the one duration of a run every figure uses (costs.wall_s), and what the UIs' own durations are
WALL_TIME = "first attempt's start to last attempt's end"
OTHER_DURATIONS = (
    "the MLflow run's duration adds tracking set-up and finalize, the Prefect flow run's "
    "validation, quota, provisioning and teardown"
)


def run_status(results: list[AttemptResult]) -> str:
    return "succeeded" if results and results[-1].outcome == Outcome.SUCCEEDED else "failed"


def public_uri(uri: str) -> str:
    """The URI without user:password, for anything a person reads."""
    parts = urlsplit(uri)
    if parts.username or parts.password:
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit(parts._replace(netloc=netloc))
    return uri


def mlflow_command() -> str:
    """How to start this environment's MLflow (the one that wrote the store): `mlflow` when that
    is what PATH finds, else its path beside this interpreter (a venv that is not activated), else
    the interpreter's module."""
    beside = Path(sys.executable).parent / "mlflow"
    if not beside.exists():
        return f"{shlex.quote(sys.executable)} -m mlflow"
    found = shutil.which("mlflow")
    if found and Path(found).resolve() == beside.resolve():
        return "mlflow"
    return shlex.quote(str(beside))


def mlflow_ui_command(tracking_uri: str) -> str:
    return f"{mlflow_command()} ui --backend-store-uri {shlex.quote(tracking_uri)}"


def flow_run_url(ui_url: str | None, flow_run_id: str) -> str | None:
    return f"{ui_url.rstrip('/')}/runs/flow-run/{flow_run_id}" if ui_url and flow_run_id else None


def closing_lines(summary: RunSummary | dict, prefect_ui_url: str | None) -> list[str]:
    """The summary a person reads at the end of `trainflow run`. `prefect_ui_url`: the UI of the
    Prefect server the run was recorded on, or None for a temporary one (gone with the command)."""
    s = summary if isinstance(summary, RunSummary) else RunSummary.model_validate(summary)
    steps_seen = s.steps_reported
    lines = [f"run {s.run_id}: {s.status.upper()}" + (f" at step {s.final_step}/{s.total_steps}" if steps_seen else "")]
    if s.status != "succeeded":
        lines.append(f"  reason: {s.reason}")
    if s.features_off:
        lines.append(f"  plain torchrun script: off without trainflow.runtime: {', '.join(s.features_off)}")
    if s.final_loss is not None:
        lines.append(f"  final loss {s.final_loss:.4f}, params sha256 {str(s.params_sha256)[:16]}...")
    for row in s.attempts:
        steps = f" (from step {row.resumed_from_step} to {row.last_step})" if steps_seen else ""
        lines.append(f"  attempt {row.attempt}: {row.outcome.value}{steps}")
    wall = f"{seconds(s.costs.wall_s)} wall time ({WALL_TIME})"
    lines.append(
        f"  goodput {percent(s.goodput)} of {wall}"
        if steps_seen
        else f"  goodput: not measured (no step reports); {wall}"
    )
    if s.checkpoints:
        lines.append(f"  latest checkpoint: {s.checkpoints[-1].uri}")
    if s.quota is not None:
        lines.append(f"  quota {s.quota.limit}: held {s.quota.devices} devices, queued {s.quota.waited_s:.0f} s")
    if s.teardown is not None:
        clean = s.teardown.get("clean")
        lines.append(f"  teardown: {'clean' if clean else 'SURVIVORS ' + str(s.teardown.get('survivors'))}")
    tracking = public_uri(s.tracking_uri)
    if tracking.startswith(("http://", "https://")):
        lines.append(f"  MLflow: run {s.mlflow_run_id} at {tracking}")
    else:
        lines.append(f"  MLflow: {mlflow_ui_command(tracking)}  (run {s.mlflow_run_id})")
    url = flow_run_url(prefect_ui_url, s.prefect_flow_run_id)
    if url:
        lines.append(f"  Prefect: {url}")
    else:
        lines.append(
            f"  Prefect: flow run {s.prefect_flow_run_id} (on a temporary server, gone with this command; "
            "set PREFECT_API_URL to keep runs)"
        )
    return lines
