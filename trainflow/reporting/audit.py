"""Who launched a run, from where, with what: recorded as MLflow tags when the run starts, and read
back as one trail (`trainflow audit RUN_ID`) with the attempts and the Prefect events of its flow run.

Tags every run carries (besides spec_hash, git_commit, env_fingerprint, rerun_of, rerun_drift):
  launched_via        deployment, cli or flow (the flow called directly, e.g. `python -m flows.lifecycle`)
  prefect_deployment  the deployment's name, when launched from one
  launched_by_user    the OS user the orchestrator runs as
  launched_from_host  the host it runs on
  rerun_allow_drift   true when a rerun was started with --allow-drift (allow_drift=true)
The trail shows tags, params and events as recorded; none of them holds a secret (secret_env values
and S3 keys are never recorded; URIs are shown without user:password).
"""

from __future__ import annotations

import contextvars
import getpass
import json
import re
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

VIA_DEPLOYMENT, VIA_CLI, VIA_FLOW = "deployment", "cli", "flow"
PARENT_TAG = "mlflow.parentRunId"  # as trainflow.reporting.tracking's; not imported, so the CLI starts without mlflow
ORIGIN_TAGS = ["launched_via", "prefect_deployment", "launched_by_user", "launched_from_host"]
IDENTITY_TAGS = [
    "spec_hash",
    "git_commit",
    "git_dirty",
    "env_fingerprint",
    "workload_sha256",
    "prefect_flow_run_id",
    "status",
    "reason",
]
RERUN_TAGS = ["rerun_of", "rerun_drift", "rerun_allow_drift"]
DRIFT_ARTIFACT = "rerun/drift.json"
MLFLOW_RUN_ID = re.compile(r"^[0-9a-f]{32}$")

_VIA: contextvars.ContextVar[str] = contextvars.ContextVar("trainflow_launched_via", default=VIA_FLOW)


class AuditError(ValueError):
    """The run to audit is not in the store."""


@contextmanager
def launched_via(surface: str) -> Iterator[None]:
    """Runs started inside were launched through `surface` (the CLI says cli)."""
    token = _VIA.set(surface)
    try:
        yield
    finally:
        _VIA.reset(token)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for this uid (some containers)
        return "unknown"


def origin_tags(deployment: str | None) -> dict[str, str]:
    """Who launches this run and from where; `deployment` is the Prefect deployment's name, if any."""
    tags = {
        "launched_via": VIA_DEPLOYMENT if deployment else _VIA.get(),
        "launched_by_user": _user(),
        "launched_from_host": socket.gethostname(),
    }
    if deployment:
        tags["prefect_deployment"] = deployment
    return tags


@dataclass
class AttemptTrail:
    attempt: int
    outcome: str
    world_size: int | None
    resumed_from_step: int | None
    last_step: int | None
    reason: str
    mlflow_run_id: str


@dataclass
class EventTrail:
    occurred: str
    event: str
    resource: str
    payload: dict


@dataclass
class AuditTrail:
    mlflow_run_id: str
    run_id: str
    experiment: str
    mlflow_status: str
    started_at: int  # ms since the epoch, as MLflow keeps it
    ended_at: int | None
    origin: dict[str, str]
    identity: dict[str, str]
    rerun: dict[str, str]
    drift: list[str]
    reruns: list[str]  # later runs that reran this one
    owner: str
    team: str
    params: dict[str, str]
    attempts: list[AttemptTrail]
    events: list[EventTrail] = field(default_factory=list)
    events_note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def without_credentials(uri: str) -> str:
    """The URI without user:password."""
    parts = urlsplit(uri)
    if not (parts.username or parts.password):
        return uri
    netloc = f"{parts.hostname or ''}:{parts.port}" if parts.port else parts.hostname or ""
    return urlunsplit(parts._replace(netloc=netloc))


def _find_run(client, run_ref: str):
    from mlflow.exceptions import MlflowException

    if MLFLOW_RUN_ID.match(run_ref):
        try:
            return client.get_run(run_ref)
        except MlflowException:
            pass
    experiments = [e.experiment_id for e in client.search_experiments()]
    if experiments:
        found = client.search_runs(experiments, filter_string=f"tags.`trainflow.run_id` = '{run_ref}'")
        lifecycles = [r for r in found if PARENT_TAG not in r.data.tags]
        if lifecycles:
            return lifecycles[0]
    raise AuditError(
        f"RUN_ID {run_ref!r}: no such MLflow run (or trainflow run id) in the store (pass --tracking-uri?)"
    )


def _drift(client, run_id: str) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="trainflow-audit-") as folder:
        try:
            return list(json.loads(Path(client.download_artifacts(run_id, DRIFT_ARTIFACT, folder)).read_text()))
        except Exception:  # noqa: BLE001 - a rerun without drift logs no drift file
            return []


def _int(value) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _attempts(client, run) -> list[AttemptTrail]:
    children = client.search_runs([run.info.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{run.info.run_id}'")
    rows = [
        AttemptTrail(
            attempt=_int(child.data.tags.get("attempt")) or 0,
            outcome=child.data.tags.get("outcome", ""),
            world_size=_int(child.data.params.get("world_size")),
            resumed_from_step=_int(child.data.params.get("resumed_from_step")),
            last_step=_int(child.data.metrics.get("last_step")),
            reason=child.data.tags.get("reason", ""),
            mlflow_run_id=child.info.run_id,
        )
        for child in children
    ]
    return sorted(rows, key=lambda row: row.attempt)


def read_trail(tracking_uri: str, run_ref: str) -> AuditTrail:
    """What MLflow recorded about who ran `run_ref` (an MLflow or trainflow run id), how and what came of it."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    run = _find_run(client, run_ref)
    tags = run.data.tags
    experiments = [e.experiment_id for e in client.search_experiments()]
    reruns = client.search_runs(experiments, filter_string=f"tags.rerun_of = '{run.info.run_id}'")
    params = dict(run.data.params)
    if "checkpoint_uri" in params:
        params["checkpoint_uri"] = without_credentials(params["checkpoint_uri"])
    return AuditTrail(
        mlflow_run_id=run.info.run_id,
        run_id=tags.get("trainflow.run_id", ""),
        experiment=client.get_experiment(run.info.experiment_id).name,
        mlflow_status=run.info.status,
        started_at=run.info.start_time,
        ended_at=run.info.end_time,
        origin={k: tags[k] for k in ORIGIN_TAGS if k in tags},
        identity={k: tags[k] for k in IDENTITY_TAGS if k in tags},
        rerun={k: tags[k] for k in RERUN_TAGS if k in tags},
        drift=_drift(client, run.info.run_id) if tags.get("rerun_drift") == "true" else [],
        reruns=[r.info.run_id for r in reruns],
        owner=tags.get("owner", ""),
        team=tags.get("team", ""),
        params=params,
        attempts=_attempts(client, run),
    )
