"""The analysis notebook and the run pictures on the session's finished runs (finished_runs.py): a
run whose worker crashes once and its fault-free rerun, in one MLflow store; finalize logs each
run's pictures, the Prefect summary shows them, and the notebook, executed with a real kernel,
lists and draws both runs."""

from __future__ import annotations

import json
import struct
import urllib.request
from pathlib import Path

import nbformat
import pytest
from mlflow.tracking import MlflowClient
from nbclient import NotebookClient

from tests.conftest import ROOT
from tests.integration.finished_runs import EXPERIMENT, STEPS, FinishedRuns

pytestmark = pytest.mark.integration

NOTEBOOK = ROOT / "notebooks" / "analyze_runs.ipynb"
PICTURES = {"plots/timeline.png", "plots/goodput.png"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def drilled(finished_runs: FinishedRuns) -> dict:
    """The faulted run (a worker crash, resumed) and its fault-free rerun, as a fault drill reports them."""
    faulted, baseline = finished_runs.original, finished_runs.rerun
    report = {
        "mlflow_run_id": faulted["mlflow_run_id"],
        "baseline_mlflow_run_id": baseline["mlflow_run_id"],
        "prefect_flow_run_id": faulted["prefect_flow_run_id"],
        "goodput": faulted["goodput"],
        "outcomes": [a["outcome"] for a in faulted["attempts"] + baseline["attempts"]],
    }
    return {"report": report, "tracking_uri": finished_runs.tracking_uri, "api": finished_runs.api}


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    return struct.unpack(">II", data[16:24])


def test_each_finished_run_has_its_pictures_in_mlflow(drilled, tmp_path):
    client = MlflowClient(drilled["tracking_uri"])
    report = drilled["report"]
    for run_id in (report["baseline_mlflow_run_id"], report["mlflow_run_id"]):
        assert {a.path for a in client.list_artifacts(run_id, "plots")} >= PICTURES
        for path in sorted(PICTURES):
            data = Path(client.download_artifacts(run_id, path, str(tmp_path))).read_bytes()
            assert png_size(data) == (1200, 500) and len(data) > 10_000
        summary = json.loads(Path(client.download_artifacts(run_id, "summary.json", str(tmp_path))).read_text())
        assert set(summary["plots"]) == PICTURES


def test_prefect_summary_artifact_shows_the_pictures(drilled):
    request = urllib.request.Request(
        f"{drilled['api']}/artifacts/filter",
        data=json.dumps(
            {
                "artifacts": {
                    "flow_run_id": {"any_": [drilled["report"]["prefect_flow_run_id"]]},
                    "type": {"any_": ["markdown"]},
                }
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        [artifact] = json.loads(response.read())
    markdown = artifact["data"]
    assert markdown.count("](data:image/png;base64,iVBORw0KGgo") == 2  # both pictures inline, as PNG
    assert "plots/timeline.png" in markdown and "plots/goodput.png" in markdown


def test_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert "parameters" in code[0].metadata.get("tags", [])


def test_notebook_lists_compares_and_draws_the_runs(drilled, monkeypatch):
    report = drilled["report"]
    monkeypatch.setenv("TRAINFLOW_TRACKING_URI", drilled["tracking_uri"])
    monkeypatch.setenv("TRAINFLOW_EXPERIMENT", EXPERIMENT)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # python3 is the venv's kernel: ipykernel is installed there and jupyter_client starts this interpreter
    NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()  # raises on a failed cell

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    kinds = ("text/plain", "text/html", "text/markdown")
    text = "\n".join(o.get("text", "") + "".join(o.get("data", {}).get(kind, "") for kind in kinds) for o in outputs)
    assert report["mlflow_run_id"] in text and report["baseline_mlflow_run_id"] in text
    # every attempt of both runs is in the attempts table, with its outcome
    client = MlflowClient(drilled["tracking_uri"])
    for run_id in (report["mlflow_run_id"], report["baseline_mlflow_run_id"]):
        run = client.get_run(run_id)
        assert run.data.tags["trainflow.run_id"] in text
    assert all(outcome in text for outcome in report["outcomes"])
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    # attempts chart, loss per attempt, both runs' timeline and goodput, checkpoint timings
    assert len(images) >= 7, len(images)


def prefect_get(api: str, path: str, body: dict | None = None):
    request = urllib.request.Request(
        f"{api}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def test_every_figure_of_the_faulted_run_agrees_to_the_printed_digit(drilled, tmp_path):
    """The goodput picture's title and bars, the MLflow metrics, summary.json, the Prefect summary
    artifact and the diagnosis, for the run whose worker crashed: one ledger, printed one way."""
    from trainflow.contracts.ledger import milliseconds, percent, seconds
    from trainflow.reporting.plots import picture_titles
    from trainflow.reporting.plots.data import goodput_breakdown, timeline_data
    from trainflow.reporting.plots.render import draw_goodput, draw_timeline, figure_texts, new_figure
    from trainflow.reporting.plots.store import metric_histories

    report, client = drilled["report"], MlflowClient(drilled["tracking_uri"])
    run_id = report["mlflow_run_id"]
    summary = json.loads(Path(client.download_artifacts(run_id, "summary.json", str(tmp_path))).read_text())
    figures = summary["costs"]
    # the summary's figures are the run's metrics under summary/, after the step series in MLflow's UI
    metrics = {
        k.removeprefix("summary/"): v
        for k, v in client.get_run(run_id).data.metrics.items()
        if k.startswith("summary/")
    }
    assert [a["outcome"] for a in summary["attempts"]][-1] == "SUCCEEDED" and len(summary["attempts"]) == 2
    assert summary["goodput"] == figures["goodput"] == metrics["goodput"] == report["goodput"]
    for key, value in figures.items():  # every figure of the ledger is the run's metric summary/<name>
        assert metrics[key] == pytest.approx(value, abs=1e-9), key

    figure = new_figure()
    draw_goodput(figure, goodput_breakdown(summary))
    title, texts = figure.get_suptitle(), figure_texts(figure)
    goodput, wall = percent(metrics["goodput"]), seconds(metrics["wall_s"])
    assert f"goodput {goodput} of {wall}, mean step {milliseconds(metrics['mean_step_time_s'])}" in title
    assert f"{seconds(metrics['productive_s'])}  ({goodput})" in texts  # the productive bar: the goodput again
    stall_share = percent(metrics["checkpoint_stall_total_s"] / metrics["wall_s"])
    assert f"{seconds(metrics['checkpoint_stall_total_s'])}  ({stall_share})" in texts
    assert (
        f"{seconds(metrics['recovery_s_total'])}  ({percent(metrics['recovery_s_total'] / metrics['wall_s'])})" in texts
    )

    [artifact] = prefect_get(
        drilled["api"],
        "/artifacts/filter",
        {"artifacts": {"flow_run_id": {"any_": [report["prefect_flow_run_id"]]}, "type": {"any_": ["markdown"]}}},
    )
    markdown = artifact["data"]
    assert f"![{title}](data:image/png;base64," in markdown  # the logged picture, titled as drawn here
    assert picture_titles(summary)["goodput.png"] == title
    assert f"| Goodput | {goodput} of {wall} wall time |" in markdown
    assert f"mean step {milliseconds(metrics['mean_step_time_s'])} |" in markdown
    stalls = f"{seconds(metrics['checkpoint_stall_total_s'])}, {percent(metrics['checkpoint_share'])} of step time"
    assert f"| Checkpoint stalls | {stalls} |" in markdown

    diagnosis = Path(client.download_artifacts(run_id, "diagnosis.md", str(tmp_path))).read_text()
    assert diagnosis.splitlines() == [f"- {finding}" for finding in summary["diagnosis"]] or (
        not summary["diagnosis"] and diagnosis == "- nothing to report"
    )
    stall_findings = [f for f in summary["diagnosis"] if f.startswith("checkpoints stall")]
    if metrics["checkpoint_share"] > 0.05:
        assert stall_findings == [
            f"checkpoints stall training for {stalls} (> 5.0%): save less often or asynchronously"
        ]
    else:
        assert not stall_findings

    # the last loss point is the final step's own, and it is final_loss
    loss = sorted((m.timestamp, m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert loss[-1][1] == summary["final_step"] == STEPS
    assert loss[-1][2] == pytest.approx(summary["final_loss"], rel=1e-12) == metrics["final_loss"]

    # the timeline counts the steps each attempt ran, not the points recorded
    histories = metric_histories(client, run_id)
    figure = new_figure()
    draw_timeline(figure, timeline_data(summary, histories))
    texts = figure_texts(figure)
    crashed, finished = summary["attempts"]
    assert finished["steps_run"] == finished["last_step"] - finished["resumed_from_step"]  # every step, once
    assert crashed["steps_run"] >= crashed["last_step"] - crashed["resumed_from_step"]  # rank 0 may be one ahead
    for row in summary["attempts"]:
        assert any(f"({row['steps_run']} steps, {seconds(row['step_time_s'])} of step time)" in t for t in texts)
    assert sum(row["steps_run"] for row in summary["attempts"]) == metrics["steps_run"]


def test_flow_runs_are_named_after_the_trainflow_run(drilled, tmp_path):
    client = MlflowClient(drilled["tracking_uri"])
    report = drilled["report"]
    names = set()
    for run_id in (report["mlflow_run_id"], report["baseline_mlflow_run_id"]):
        run = client.get_run(run_id)
        flow_run = prefect_get(drilled["api"], f"/flow_runs/{run.data.tags['prefect_flow_run_id']}")
        assert flow_run["name"] == run.data.tags["trainflow.run_id"]
        names.add(flow_run["name"])
    assert len(names) == 2  # the baseline and the faulted run of one spec, told apart
