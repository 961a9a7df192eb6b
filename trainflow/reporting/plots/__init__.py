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

from trainflow.contracts import RunSummary
from trainflow.reporting.plots.data import as_summary, goodput_breakdown, timeline_data
from trainflow.reporting.plots.store import metric_histories
from trainflow.reporting.tracking import Tracker

ARTIFACT_FOLDER = "plots"
TIMELINE_PNG = "timeline.png"
GOODPUT_PNG = "goodput.png"
CAPTIONS = {
    TIMELINE_PNG: "Timeline: attempts by outcome, failure detection, recovery, checkpoints, step progress",
    GOODPUT_PNG: "Goodput: where the wall time went",
}
EMBED_LIMIT_BYTES = 512 * 1024  # larger pictures are linked, not inlined into the markdown


def render_run_plots(summary: RunSummary | dict, histories: dict, folder: Path) -> list[Path]:
    """Write the timeline and goodput PNGs of a finished run into `folder`."""
    # matplotlib is imported here, not with the package: without it a run loses its pictures, not its finalize
    from trainflow.reporting.plots.render import render_goodput, render_timeline

    return [
        render_timeline(timeline_data(summary, histories), folder / TIMELINE_PNG),
        render_goodput(goodput_breakdown(summary), folder / GOODPUT_PNG),
    ]


def picture_titles(summary: RunSummary | dict) -> dict[str, str]:
    """The title each picture of the run shows, by file name (the pictures' alt text)."""
    return {TIMELINE_PNG: timeline_data(summary, {}).title, GOODPUT_PNG: goodput_breakdown(summary).title}


def log_run_plots(tracker: Tracker, mlflow_run_id: str, summary: RunSummary) -> list[str]:
    """Render the run's pictures from its summary and metric histories and log them as MLflow
    artifacts under plots/; returns their artifact paths."""
    if not summary.attempts:
        return []
    histories = metric_histories(tracker.client, mlflow_run_id)
    with tempfile.TemporaryDirectory(prefix="trainflow-plots-") as folder:
        paths = render_run_plots(summary, histories, Path(folder))
        for path in paths:
            tracker.log_file(mlflow_run_id, path, ARTIFACT_FOLDER)
    return [f"{ARTIFACT_FOLDER}/{path.name}" for path in paths]


def plots_markdown(summary: RunSummary | dict, run_url: str = "") -> str:
    """A markdown section showing the run's logged pictures inline, as `data:image/png;base64` URIs
    (both Prefect UIs render those in markdown artifacts: the React UI allows `data:image/` in img
    src explicitly, the Vue UI passes image sources through), each with its title as alt text and
    captioned with its MLflow artifact path. A picture that cannot be read is named, not shown."""
    summary = as_summary(summary)
    if not summary.plots:
        return ""
    titles = picture_titles(summary)
    client = MlflowClient(summary.tracking_uri)
    lines = ["", "## Pictures", ""]
    with tempfile.TemporaryDirectory(prefix="trainflow-plots-") as folder:
        for path in summary.plots:
            name = Path(path).name
            caption = CAPTIONS.get(name, name)
            where = f"[`{path}`]({run_url}/artifactPath/{path})" if run_url else f"`{path}`"
            try:
                data = Path(client.download_artifacts(summary.mlflow_run_id, path, folder)).read_bytes()
            except Exception as exc:  # noqa: BLE001 - the summary stays useful without its pictures
                lines += [f"{caption}: {where} in the MLflow run (not readable here: {exc})", ""]
                continue
            if len(data) <= EMBED_LIMIT_BYTES:
                alt = titles.get(name, caption).replace("[", "(").replace("]", ")")
                lines += [f"![{alt}](data:image/png;base64,{base64.b64encode(data).decode()})", ""]
            lines += [f"*{caption}* ({where} in the MLflow run)", ""]
    return "\n".join(lines)
