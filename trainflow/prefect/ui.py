"""What a person sees of a run in the Prefect UI besides its task runs: a progress artifact while it
trains (step of total, attempt), a markdown summary at the end, and events for what matters
(attempt failed, recovered, checkpoint committed, run finished) for automations to act on.

These are plain functions called from the flow and the watch task, not tasks: they add no task
runs, and reporting never fails a run (a failed call is logged as a warning).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.events import emit_event

from trainflow.contracts import AttemptResult, Outcome, RunSummary
from trainflow.contracts.ledger import milliseconds, percent, seconds
from trainflow.orchestrator.failures import Decision
from trainflow.prefect.automation import (
    ATTEMPT_FAILED,
    ATTEMPT_RECOVERED,
    ATTEMPT_RESIZED,
    CHECKPOINT_COMMITTED,
    RESOURCE_PREFIX,
    RUN_FAILED,
    RUN_SUCCEEDED,
)
from trainflow.prefect.records import CheckpointRecord, RunRecord
from trainflow.reporting.plots import plots_markdown
from trainflow.reporting.summary import OTHER_DURATIONS, WALL_TIME, flow_run_url, mlflow_ui_command, public_uri

STEP_SERIES = "loss"  # every step a rank reports has one
PROGRESS_EVERY_S = 2.0  # the watch loop flushes metrics every second; the UI needs less
MLFLOW_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves a local (sqlite) store by default (tracking.ui_url)


@dataclass
class RunReport:
    """What reporting remembers about one run while it is in flight."""

    spec_name: str
    total_steps: int
    progress_id: UUID | None = None
    progress_at: float = 0.0
    failure_detected_at: float | None = None
    recovered: int = 0  # the last attempt reported as recovered


_reports: dict[str, RunReport] = {}  # by trainflow run id; the flow and its watch tasks share one process


def best_effort(function):
    """Reporting is for people: log what went wrong and let the run go on."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a UI artifact or event is never worth a failed run
            get_run_logger().warning("%s: %s: %s", function.__name__, type(exc).__name__, exc)
            return None

    return wrapper


def _resource(record: RunRecord) -> dict[str, str]:
    return {"prefect.resource.id": f"{RESOURCE_PREFIX}{record.run_id}", "prefect.resource.name": record.run_id}


def _related(record: RunRecord) -> list[dict[str, str]]:
    related = [
        {
            "prefect.resource.id": f"mlflow.run.{record.mlflow_run_id}",
            "prefect.resource.role": "mlflow-run",
            "prefect.resource.name": record.experiment,
        }
    ]
    if record.prefect_flow_run_id:
        related.append(
            {
                "prefect.resource.id": f"prefect.flow-run.{record.prefect_flow_run_id}",
                "prefect.resource.role": "flow-run",
            }
        )
    return related


_links: dict[str, dict[str, str | None]] = {}  # by trainflow run id: where a notification's reader looks


def _links_of(record: RunRecord) -> dict[str, str | None]:
    if record.run_id not in _links:
        from prefect.settings import PREFECT_UI_URL

        try:
            mlflow = mlflow_link(record)["url"]
        except Exception:  # noqa: BLE001 - a link is a convenience: the run id is in the payload anyway
            mlflow = None
        _links[record.run_id] = {
            "mlflow_url": mlflow,
            "prefect_url": flow_run_url(PREFECT_UI_URL.value(), record.prefect_flow_run_id),
        }
    return _links[record.run_id]


def _emit(event: str, record: RunRecord, payload: dict) -> None:
    emit_event(
        event,
        resource=_resource(record),
        related=_related(record),
        payload={"mlflow_run_id": record.mlflow_run_id, **_links_of(record), **payload},
    )


def _describe(report: RunReport, attempt: int, step: int) -> str:
    return f"attempt {attempt}: step {step} of {report.total_steps}"


@best_effort
def start_report(record: RunRecord) -> None:
    """Open the run's progress artifact at step 0."""
    spec = record.spec
    report = RunReport(spec.name, spec.workload.steps)
    _reports[record.run_id] = report
    report.progress_id = create_progress_artifact(  # type: ignore[assignment]  # an id when called from sync code
        0.0, key=f"{spec.name}-progress", description=f"{record.run_id}: starting, 0 of {spec.workload.steps} steps"
    )


@best_effort
def report_progress(record: RunRecord, attempt: int, rows: list[tuple[str, float, int, float]]) -> None:
    """Called with each batch of metrics the watch loop flushes; updates the artifact every few seconds
    and announces the first step of an attempt that follows a failure."""
    report = _reports.get(record.run_id)
    # the steps are the loss series' (other rows, a restore's or a node's figures, may sit at step 0)
    steps = sorted((row[2], row[3]) for row in rows if row[0] == STEP_SERIES)
    if report is None or not steps:
        return
    step = steps[-1][0]
    if report.failure_detected_at is not None and attempt > max(report.recovered, 1):
        report.recovered = attempt
        # as the summary has it: from the failure's detection to the first step of this attempt
        first_step, first_step_at = steps[0]
        recovery_s = round(max(0.0, first_step_at - report.failure_detected_at), 3)
        _emit(ATTEMPT_RECOVERED, record, {"attempt": attempt, "step": first_step, "recovery_s": recovery_s})
    if report.progress_id is None or time.monotonic() - report.progress_at < PROGRESS_EVERY_S:
        return
    report.progress_at = time.monotonic()
    update_progress_artifact(
        report.progress_id, min(100.0, 100.0 * step / report.total_steps), description=_describe(report, attempt, step)
    )


@best_effort
def report_checkpoint(record: RunRecord, snapshot: CheckpointRecord) -> None:
    """A checkpoint the snapshot task verified is committed: say so."""
    if snapshot.verified:
        _emit(
            CHECKPOINT_COMMITTED,
            record,
            {"step": snapshot.step, "uri": snapshot.uri, "bytes": snapshot.bytes, "attempt": snapshot.attempt},
        )


@best_effort
def report_attempt(record: RunRecord, result: AttemptResult, decision: Decision) -> None:
    """An attempt that did not succeed is an event, with the branch the run takes next (a resize: an
    event of its own, which the failure automation does not match)."""
    if result.outcome == Outcome.SUCCEEDED:
        return
    report = _reports.get(record.run_id)
    if report is not None:
        report.failure_detected_at = result.detected_at
    _emit(
        ATTEMPT_RESIZED if result.outcome == Outcome.RESIZED else ATTEMPT_FAILED,
        record,
        {
            "attempt": result.attempt,
            "outcome": result.outcome.value,
            "reason": result.reason[:1000],
            "last_step": result.last_step,
            "resumed_from_step": result.resumed_from_step,
            "detection_latency_s": result.detection_latency_s,
            "retry": decision.retry,
            "decision": decision.reason[:1000],
        },
    )


@best_effort
def report_run(record: RunRecord, summary: dict) -> None:
    """The end of the run: final progress, the markdown summary, and a succeeded/failed event."""
    spec = record.spec
    report = _reports.pop(record.run_id, None)
    succeeded = summary["status"] == "succeeded"
    steps = RunSummary.model_validate(summary).at_step()
    if report is not None and report.progress_id is not None:
        attempt = summary["attempts"][-1]["attempt"] if summary["attempts"] else 0
        update_progress_artifact(
            report.progress_id,
            100.0 if succeeded else min(100.0, 100.0 * summary["final_step"] / spec.workload.steps),
            description=f"{summary['status']}: "
            + (_describe(report, attempt, summary["final_step"]) if steps else f"attempt {attempt}"),
        )
    mlflow = mlflow_link(record)
    pictures = plots_markdown(summary, mlflow["url"])
    create_markdown_artifact(
        summary_markdown(summary, mlflow) + pictures,
        key=f"{spec.name}-summary",
        description=f"{record.run_id}: {summary['status']}" + (f"{steps} of {spec.workload.steps}" if steps else ""),
    )
    _emit(
        RUN_SUCCEEDED if succeeded else RUN_FAILED,
        record,
        {
            "status": summary["status"],
            "reason": str(summary["reason"])[:1000],
            "final_step": summary["final_step"],
            "total_steps": spec.workload.steps,
            "attempts": len(summary["attempts"]),
            "goodput": summary["goodput"],
            "params_sha256": summary["params_sha256"],
        },
    )
    _links.pop(record.run_id, None)


def mlflow_link(record: RunRecord) -> dict[str, str]:
    """Where to look at the run in the MLflow UI: the spec's `tracking.ui_url`, else the server itself,
    or `mlflow ui` over a local store."""
    from mlflow.tracking import MlflowClient

    experiment_id = MlflowClient(record.tracking_uri).get_run(record.mlflow_run_id).info.experiment_id
    uri = public_uri(record.tracking_uri)
    local = not uri.startswith(("http://", "https://"))
    base = (record.spec.tracking.ui_url or (MLFLOW_UI if local else uri)).rstrip("/")
    return {
        "url": f"{base}/#/experiments/{experiment_id}/runs/{record.mlflow_run_id}",
        "command": mlflow_ui_command(uri) if local else "",
        "tracking_uri": uri,
    }


def _cell(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def summary_markdown(summary: RunSummary | dict, mlflow: dict[str, str]) -> str:
    """The run at a glance: outcome, where the time went (the ledger's figures, printed as the
    pictures print them), attempts with their timings and lost steps, checkpoints, and where MLflow
    keeps the rest."""
    s = summary if isinstance(summary, RunSummary) else RunSummary.model_validate(summary)
    f = s.costs
    steps_seen = s.steps_reported
    lines = [
        f"# {s.run_id}",
        "",
        f"| Status | {s.status}" + (f" at step {s.final_step} of {s.total_steps} |" if steps_seen else " |"),
        "|---|---|",
        f"| Reason | {_cell(s.reason)} |",
        f"| Goodput | {percent(s.goodput) if steps_seen else 'not measured'} of {seconds(f.wall_s)} wall time |",
        f"| Wall time | {seconds(f.wall_s)}: {WALL_TIME}; {OTHER_DURATIONS} |",
        f"| Steps run | {f.steps_run}, mean step {milliseconds(f.mean_step_time_s)} |",
        f"| Lost work | {f.lost_steps} steps, {seconds(f.lost_work_s)} |",
        f"| Failure detection, recovery | {seconds(f.detection_s_total)}, {seconds(f.recovery_s_total)} |",
        f"| Checkpoint stalls | {seconds(f.checkpoint_stall_total_s)}, {percent(f.checkpoint_share)} of step time |",
        f"| Final loss | {_cell(s.final_loss, 4)} |",
        f"| Parameters sha256 | `{s.params_sha256 or '–'}` |",
        f"| MLflow run | [{s.mlflow_run_id}]({mlflow['url']}) in experiment `{s.experiment}` |",
        f"| Tracking URI | `{mlflow['tracking_uri']}` |",
    ]
    if mlflow["command"]:
        lines.append(f"| Open it with | `{mlflow['command']}` |")
    if s.teardown:
        clean = (
            "clean" if s.teardown.get("clean") else "survivors: " + _cell("; ".join(s.teardown.get("survivors", [])))
        )
        lines.append(f"| Teardown | {clean} |")
    if s.diagnosis:
        lines += ["", "## Diagnosis", ""] + [f"- {finding}" for finding in s.diagnosis]
    lines += [
        "",
        "## Attempts",
        "",
        "| Attempt | Outcome | World size | Steps | Detection (s) | Recovery (s) | Lost steps | Reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in s.attempts:
        lines.append(
            f"| {row.attempt} | {row.outcome.value} | {row.world_size} | {row.resumed_from_step} → "
            f"{row.last_step} | {_cell(row.detection_latency_s)} | {_cell(row.recovery_s)} | "
            f"{row.lost_steps} | {_cell(row.reason)} |"
        )
    lines += ["", "## Checkpoints", ""]
    if s.checkpoints:
        lines += ["| Step | URI | Verified |", "|---|---|---|"]
        lines += [f"| {c.step} | `{c.uri}` | {'yes' if c.verified else 'NO'} |" for c in s.checkpoints]
    else:
        lines.append("No committed checkpoint is kept.")
    return "\n".join(lines) + "\n"
