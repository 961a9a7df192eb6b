"""Reading runs back from MLflow for the pictures and the analysis notebook: metric histories,
the run summary, and tables of runs and of their attempts (nested runs)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from trainflow.contracts import RunSummary
from trainflow.reporting.figures import summary_figures
from trainflow.reporting.plots.data import PLOT_METRICS, Histories

PARENT_TAG = "mlflow.parentRunId"


def metric_histories(client: MlflowClient, run_id: str, keys: tuple[str, ...] = PLOT_METRICS) -> Histories:
    """Each metric's history as (step, value, unix seconds), in the order MLflow returns it."""
    histories: Histories = {}
    for key in keys:
        points = client.get_metric_history(run_id, key)
        if points:
            histories[key] = [(m.step, m.value, m.timestamp / 1000.0) for m in points]
    return histories


def run_summary(client: MlflowClient, run_id: str) -> dict | None:
    """The run's summary.json artifact (finalize writes it), or None for a run that never finished
    or one recorded before the summary carried the run ledger's figures."""
    with tempfile.TemporaryDirectory(prefix="trainflow-summary-") as folder:
        try:
            path = client.download_artifacts(run_id, "summary.json", folder)
        except Exception:  # noqa: BLE001 - MLflow raises different errors per store for a missing artifact
            return None
        summary = json.loads(Path(path).read_text())
    try:
        RunSummary.model_validate(summary)
    except ValidationError:
        return None
    return summary


def experiment_runs(client: MlflowClient, experiment: str) -> tuple[list, list]:
    """(lifecycle runs, attempt runs) of an experiment, newest first."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no MLflow experiment named {experiment!r} at {client.tracking_uri}")
    runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time DESC"], max_results=5000)
    parents = [r for r in runs if PARENT_TAG not in r.data.tags]
    children = [r for r in runs if PARENT_TAG in r.data.tags]
    return parents, children


def _seconds(run) -> float | None:
    if run.info.end_time is None or run.info.start_time is None:
        return None
    return round((run.info.end_time - run.info.start_time) / 1000.0, 2)


def runs_table(client: MlflowClient, experiment: str) -> list[dict]:
    """One row per lifecycle run: its status, attempts, final loss, goodput, final parameters' hash, duration."""
    parents, _ = experiment_runs(client, experiment)
    rows = []
    for run in parents:
        metrics, tags = summary_figures(run.data.metrics), run.data.tags
        rows.append(
            {
                "mlflow_run_id": run.info.run_id,
                "run_id": tags.get("trainflow.run_id", run.info.run_name),
                "status": tags.get("status", run.info.status.lower()),
                "attempts": int(metrics["attempts"]) if "attempts" in metrics else None,
                "final_step": int(metrics["final_step"]) if "final_step" in metrics else None,
                "final_loss": metrics.get("final_loss"),
                "goodput": metrics.get("goodput"),
                "params_sha256": None if tags.get("params_sha256") in (None, "None") else tags["params_sha256"],
                "duration_s": _seconds(run),
            }
        )
    return rows


def attempts_table(client: MlflowClient, experiment: str) -> list[dict]:
    """One row per attempt of every run: outcome, detection latency, duration, steps reached."""
    parents, children = experiment_runs(client, experiment)
    names = {r.info.run_id: r.data.tags.get("trainflow.run_id", r.info.run_name) for r in parents}
    rows = []
    for run in children:
        metrics, tags = run.data.metrics, run.data.tags
        rows.append(
            {
                "run_id": names.get(tags[PARENT_TAG], tags.get("trainflow.run_id")),
                "mlflow_run_id": tags[PARENT_TAG],
                "attempt": int(tags.get("attempt", run.data.params.get("attempt", 0))),
                "outcome": tags.get("outcome"),
                "resumed_from_step": int(run.data.params.get("resumed_from_step", 0)),
                "last_step": int(metrics["last_step"]) if "last_step" in metrics else None,
                "duration_s": None if "duration_s" not in metrics else round(metrics["duration_s"], 2),
                "detection_latency_s": metrics.get("detection_latency_s"),
            }
        )
    return sorted(rows, key=lambda r: (r["run_id"] or "", r["attempt"]))
