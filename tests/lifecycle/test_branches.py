"""The flow's branching in seconds: retry, crash loop, user error, exclusion of a lost node, and
teardown after an exception and after a stop request, each checked in the summary, MLflow and
what the backend was asked to do."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient

import tasks.provision
import tasks.watch
from flows.lifecycle import training_lifecycle
from tests.conftest import ROOT
from tests.lifecycle.scripted_backend import Act, End, ScriptedLauncher
from trainflow import backends
from trainflow.orchestrator.status import StatusServer
from trainflow.orchestrator.watcher import AttemptWatcher
from trainflow.runspec import RunSpec

STEPS = 12


@pytest.fixture
def run_flow(prefect_harness, tmp_path, monkeypatch):
    """Run the lifecycle on the scripted backend; returns (summary or exception, launcher, client, spec)."""
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))

    def run(acts: list[Act], **overrides):
        launcher = ScriptedLauncher(acts)
        monkeypatch.setitem(backends._REGISTRY, "local", lambda: launcher)

        class Channel(StatusServer):  # the scripted ranks wait until the orchestrator knows them
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                launcher.channel = self

        monkeypatch.setattr(tasks.provision, "StatusServer", Channel)
        fields = {
            "name": "branches",
            "workload": {"entrypoint": str(ROOT / "examples/digits/train.py"), "steps": STEPS},
            "resources": {"nodes": 2, **overrides.pop("resources", {})},
            "checkpoint": {"uri": str(tmp_path / "checkpoints"), "every_steps": 1000},
            "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
            "fault_tolerance": {
                "backoff_s": 0,
                "heartbeat_interval_s": 0.2,
                "heartbeat_timeout_s": 2.0,
                **overrides.pop("fault_tolerance", {}),
            },
        }
        spec = RunSpec.model_validate(fields)
        client = MlflowClient(spec.tracking.uri)
        try:
            state = training_lifecycle(spec, return_state=True)
        except KeyboardInterrupt as exc:  # a stop request goes through the flow to the caller
            return exc, launcher, client, spec
        assert launcher.lost == []  # no scripted rank ever found the orchestrator gone
        # a Failed state returns its summary; a crashed flow run its exception
        return state.result(raise_on_failure=False), launcher, client, spec

    yield run
    mlflow.set_tracking_uri(None)


def summary_of(outcome) -> dict:
    assert isinstance(outcome, dict), outcome
    return outcome


def runs_of(client: MlflowClient, experiment: str = "branches"):
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def parent_run(client):
    return [r for r in runs_of(client) if "mlflow.parentRunId" not in r.data.tags]


def outcomes(summary: dict) -> list[str]:
    return [a["outcome"] for a in summary["attempts"]]


def test_a_crash_is_retried_and_the_run_succeeds(run_flow):
    outcome, launcher, client, _ = run_flow([Act(End.crash, steps=5, node=1), Act(End.finish)])
    summary = summary_of(outcome)
    assert summary["status"] == "succeeded" and summary["final_step"] == STEPS
    assert outcomes(summary) == ["CRASHED", "SUCCEEDED"]
    assert "scripted crash at step 5" in summary["attempts"][0]["reason"]
    assert summary["teardown"]["clean"] and launcher.released == launcher.provisioned
    (run,) = parent_run(client)
    assert run.info.status == "FINISHED"
    assert sorted(r.data.tags["outcome"] for r in runs_of(client) if "attempt" in r.data.tags) == [
        "CRASHED",
        "SUCCEEDED",
    ]


def test_the_same_crash_twice_is_a_crash_loop(run_flow):
    outcome, launcher, client, _ = run_flow([Act(End.crash, steps=4), Act(End.crash, steps=4), Act(End.finish)])
    summary = summary_of(outcome)
    assert summary["status"] == "failed" and "crash loop" in summary["reason"]
    assert outcomes(summary) == ["CRASHED", "CRASHED"]
    assert summary["teardown"]["clean"] and len(launcher.launched_world_sizes) == 2
    (run,) = parent_run(client)
    assert run.info.status == "FAILED"


def test_an_exit_before_the_first_step_is_the_users_error_and_not_retried(run_flow):
    outcome, launcher, _, _ = run_flow([Act(End.crash, steps=0), Act(End.finish)])
    summary = summary_of(outcome)
    assert outcomes(summary) == ["USER_ERROR"] and summary["status"] == "failed"
    assert "scripted crash at step 0" in summary["reason"]
    assert len(launcher.launched_world_sizes) == 1


def test_a_lost_node_that_cannot_come_back_is_left_out_down_to_min_nodes(run_flow):
    outcome, launcher, _, _ = run_flow([Act(End.silent, steps=6, node=1), Act(End.finish)], resources={"min_nodes": 1})
    summary = summary_of(outcome)
    assert outcomes(summary) == ["NODE_LOST", "SUCCEEDED"] and summary["status"] == "succeeded"
    assert launcher.launched_world_sizes == [2, 1]
    assert [a["world_size"] for a in summary["attempts"]] == [2, 1]


def test_a_backend_exception_still_tears_down_and_fails_the_mlflow_run(run_flow):
    outcome, launcher, client, _ = run_flow([Act(End.crash, steps=3), Act(End.launch_fails)])
    assert isinstance(outcome, RuntimeError) and "could not start" in str(outcome)
    assert launcher.released == launcher.provisioned and not launcher.provisioned[0].exists()
    (run,) = parent_run(client)
    assert run.info.status == "FAILED" and run.data.tags["reason"] == "the lifecycle stopped before finalize"


def test_a_stop_request_tears_down_and_kills_the_mlflow_run(run_flow):
    outcome, launcher, client, _ = run_flow([Act(End.crash, steps=3), Act(End.interrupted)])
    assert isinstance(outcome, KeyboardInterrupt)
    assert launcher.released == launcher.provisioned and not launcher.provisioned[0].exists()
    (run,) = parent_run(client)
    assert run.info.status == "KILLED"
    assert run.data.tags["reason"] == "stopped by SIGTERM before it finished"


def test_a_watch_that_breaks_fails_the_run_and_tears_down_instead_of_waiting(run_flow, monkeypatch):
    class BrokenWatcher(AttemptWatcher):  # the watch task raises before it has passed on any commit
        def run(self):
            raise RuntimeError("the watcher broke")

    monkeypatch.setattr(tasks.watch, "AttemptWatcher", BrokenWatcher)
    outcome, launcher, client, _ = run_flow([Act(End.silent, steps=3, checkpoint_at=2), Act(End.finish)])
    assert isinstance(outcome, RuntimeError) and "the watcher broke" in str(outcome)
    assert launcher.released == launcher.provisioned and not launcher.provisioned[0].exists()
    (run,) = parent_run(client)
    assert run.info.status == "FAILED" and run.data.tags["reason"] == "the lifecycle stopped before finalize"
