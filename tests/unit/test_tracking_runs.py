"""What the MLflow UI shows of a run: training experiments, attempt runs spanning the attempt, and
summary figures after the step series."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from trainflow.reporting.figures import summary_figures, summary_metric_rows
from trainflow.reporting.tracking import EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT, Tracker


def test_experiments_are_training_experiments_and_a_chosen_kind_is_kept(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker, client = Tracker(uri), MlflowClient(uri)
    made = tracker.experiment_id("new")
    assert client.get_experiment(made).tags[EXPERIMENT_KIND_TAG] == TRAINING_EXPERIMENT
    older = client.create_experiment("older")  # recorded before experiments had a kind
    tracker.experiment_id("older")
    assert client.get_experiment(older).tags[EXPERIMENT_KIND_TAG] == TRAINING_EXPERIMENT
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "finetuning"})
    tracker.experiment_id("chosen")
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "finetuning"


def test_a_run_spans_the_times_it_is_given(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri)
    run = tracker.start_run("times", "attempt", {}, start_time=1_700_000_000.25)
    tracker.end_run(run, "FAILED", end_time=1_700_000_024.65)
    info = MlflowClient(uri).get_run(run).info
    assert (info.start_time, info.end_time, info.status) == (1_700_000_000_250, 1_700_000_024_650, "FAILED")


def test_summary_figures_are_namespaced_and_read_back_by_their_names():
    rows = summary_metric_rows({"goodput": 0.8, "device_hours": 0.01}, 60, 1.0)
    assert [row[0] for row in rows] == ["summary/goodput", "summary/device_hours"]
    assert sorted(["loss", "step_time_s", *(row[0] for row in rows)])[:2] == ["loss", "step_time_s"]
    metrics = summary_figures({"loss": 0.5, **{key: value for key, value, _, _ in rows}})
    assert metrics["goodput"] == 0.8 and metrics["loss"] == 0.5
    assert summary_figures({"goodput": 0.7})["goodput"] == 0.7  # a run recorded before the namespace
