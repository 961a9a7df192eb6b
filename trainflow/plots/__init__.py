"""Pictures of a lifecycle run, logged to MLflow by finalize and drawn again by the notebook:

- a timeline: attempts as bars coloured by outcome, failure detections, recovery spans, checkpoint
  commits and step progress on one clock;
- a goodput breakdown: the wall time split into productive training, lost work, failure detection,
  recovery, checkpoint stalls, and startup/other.

`data` shapes numbers (no MLflow, no matplotlib), `render` draws, `store` reads MLflow.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

from mlflow.tracking import MlflowClient

from trainflow.plots.data import goodput_breakdown, timeline_data
from trainflow.plots.store import metric_histories
from trainflow.tracking import Tracker

ARTIFACT_FOLDER = "plots"
TIMELINE_PNG = "timeline.png"
GOODPUT_PNG = "goodput.png"
CAPTIONS = {
    TIMELINE_PNG: "Timeline: attempts by outcome, failure detection, recovery, checkpoints, step progress",
    GOODPUT_PNG: "Goodput: where the wall time went",
}
EMBED_LIMIT_BYTES = 512 * 1024  # larger pictures are linked, not inlined into the markdown


def render_run_plots(summary: dict, histories: dict, folder: Path) -> list[Path]:
    """Write the timeline and goodput PNGs of a finished run into `folder`."""
    # matplotlib is imported here, not with the package: without it a run loses its pictures, not its finalize
    from trainflow.plots.render import render_goodput, render_timeline

    return [
        render_timeline(timeline_data(summary, histories), folder / TIMELINE_PNG),
        render_goodput(goodput_breakdown(summary, histories), folder / GOODPUT_PNG),
    ]


def log_run_plots(tracker: Tracker, mlflow_run_id: str, summary: dict) -> list[str]:
    """Render the run's pictures from its summary and metric histories and log them as MLflow
    artifacts under plots/; returns their artifact paths."""
    if not summary.get("attempts"):
        return []
    histories = metric_histories(tracker.client, mlflow_run_id)
    with tempfile.TemporaryDirectory(prefix="trainflow-plots-") as folder:
        paths = render_run_plots(summary, histories, Path(folder))
        for path in paths:
            tracker.log_file(mlflow_run_id, path, ARTIFACT_FOLDER)
    return [f"{ARTIFACT_FOLDER}/{path.name}" for path in paths]


def plots_markdown(tracking_uri: str, mlflow_run_id: str, paths: list[str], run_url: str = "") -> str:
    """A markdown section showing the run's logged pictures inline, as `data:image/png;base64` URIs
    (both Prefect UIs render those in markdown artifacts: the React UI allows `data:image/` in img
    src explicitly, the Vue UI passes image sources through), each captioned with its MLflow
    artifact path. A picture that cannot be read is named, not shown."""
    if not paths:
        return ""
    client = MlflowClient(tracking_uri)
    lines = ["", "## Pictures", ""]
    with tempfile.TemporaryDirectory(prefix="trainflow-plots-") as folder:
        for path in paths:
            name = Path(path).name
            where = f"[`{path}`]({run_url}/artifactPath/{path})" if run_url else f"`{path}`"
            try:
                data = Path(client.download_artifacts(mlflow_run_id, path, folder)).read_bytes()
            except Exception as exc:  # noqa: BLE001 - the summary stays useful without its pictures
                lines += [f"{CAPTIONS.get(name, name)}: {where} in the MLflow run (not readable here: {exc})", ""]
                continue
            if len(data) <= EMBED_LIMIT_BYTES:
                lines += [f"![{CAPTIONS.get(name, name)}](data:image/png;base64,{base64.b64encode(data).decode()})", ""]
            lines += [f"*{CAPTIONS.get(name, name)}* ({where} in the MLflow run)", ""]
    return "\n".join(lines)
