"""`trainflow run`'s head start for warm workers: the first node slot's zygote starts before the
flow, marked with the run id the flow will use; the provisioning takes it (its log goes into the
run's scratch, the other slots become its clones) and the release ends it; one no provisioning
took ends with the block. A run id given to the flow must be a fresh folder name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import job_processes as marked
from trainflow.backends.local.launcher import LocalLauncher
from trainflow.run_id import checked_run_id
from trainflow.runspec import load_spec

SPEC = Path(__file__).resolve().parents[2] / "examples" / "digits" / "spec.yaml"
RUN_ID = "digits-head-start-1"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_the_provisioning_takes_the_head_start_and_the_release_ends_it(home, monkeypatch):
    spec = load_spec(SPEC, [])
    launcher = LocalLauncher()
    with launcher.head_start(spec, RUN_ID):
        [early] = marked(RUN_ID)
        monkeypatch.setenv("_MLFLOW_TELEMETRY_SESSION_ID", "set by MLflow as the orchestrator starts tracking")
        assert (home / "runs" / f"{RUN_ID}.warm.log").exists()
        allocation = launcher.provision(spec, RUN_ID, home / "runs" / RUN_ID)
        first, second = allocation.warm_pools[0], allocation.warm_pools[1]
        assert first.process.pid == early.pid
        assert first.log_path == allocation.scratch / "warm-0.log" and first.log_path.exists()
        assert not (home / "runs" / f"{RUN_ID}.warm.log").exists()
        assert second.source is first and second.process is None  # a clone, made at its first launch
        assert first.channel.wait_ready(120) is not None
        report = launcher.release(allocation)
    assert report.released_standbys == 1 and not report.survivors
    assert not marked(RUN_ID)
    assert not list((home / "runs").iterdir())


def test_a_head_start_no_provisioning_took_ends_with_its_block(home):
    with LocalLauncher.head_start(load_spec(SPEC, []), RUN_ID):
        assert len(marked(RUN_ID)) == 1
    assert not marked(RUN_ID)
    assert not list((home / "runs").iterdir())


def test_a_head_start_for_another_environment_is_not_taken(home, monkeypatch):
    spec = load_spec(SPEC, [])
    launcher = LocalLauncher()
    with launcher.head_start(spec, RUN_ID):
        [early] = marked(RUN_ID)
        monkeypatch.setenv("SOME_SETTING_READ_AT_IMPORT", "1")  # the zygote imported without it
        allocation = launcher.provision(spec, RUN_ID, home / "runs" / RUN_ID)
        assert allocation.warm_pools[0].process.pid != early.pid
        launcher.release(allocation)
    assert not marked(RUN_ID)


def test_no_head_start_where_the_nodes_have_networks_of_their_own_or_start_cold(home):
    for overrides in (["resources.network=namespaces"], ["resources.warm_workers=false"]):
        with LocalLauncher.head_start(load_spec(SPEC, overrides), RUN_ID):
            assert not marked(RUN_ID)


@pytest.mark.parametrize("run_id", ["", "../elsewhere", "a b", "-starts-with-a-dash", "x" * 129])
def test_a_run_id_given_to_the_flow_must_name_a_folder(run_id, home):
    with pytest.raises(ValueError, match="run_id"):
        checked_run_id(run_id)


def test_a_run_id_given_to_the_flow_must_be_unused(home):
    assert checked_run_id(RUN_ID) == RUN_ID
    (home / "runs" / RUN_ID).mkdir(parents=True)
    with pytest.raises(ValueError, match="in use"):
        checked_run_id(RUN_ID)
