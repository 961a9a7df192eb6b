"""`trainflow run`'s head start for warm workers: the first node slot's zygote starts before the
flow, the provisioning takes it (its log goes into the run's scratch, the other slots become its
clones), the release ends it by its own job marker; one no provisioning took ends with the block."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from trainflow.backends.local.launcher import LocalLauncher
from trainflow.spec import load_spec
from trainflow.worker_config import JOB_ENV

SPEC = Path(__file__).resolve().parents[2] / "examples" / "digits" / "spec.yaml"


def marked(prefix: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(JOB_ENV, "").startswith(prefix) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_the_provisioning_takes_the_head_start_and_the_release_ends_it(home):
    spec = load_spec(SPEC, [])
    launcher = LocalLauncher()
    with launcher.head_start(spec):
        [early] = [p for p in marked("warm-")]
        tag = early.environ()[JOB_ENV]
        assert list((home / "runs").glob(f"{tag}.log"))
        allocation = launcher.provision(spec, "head-start-run", home / "runs" / "head-start-run")
        first, second = allocation.warm_pools[0], allocation.warm_pools[1]
        assert first.tag == tag and first.process.pid == early.pid
        assert first.log_path == allocation.scratch / "warm-0.log" and first.log_path.exists()
        assert second.source is first and second.process is None  # a clone, made at its first launch
        assert first.channel.wait_ready(120) is not None
        report = launcher.release(allocation)
    assert report.released_standbys == 1 and not report.survivors
    assert not marked(tag) and not marked("head-start-run")
    assert not list((home / "runs").glob("warm-*.log"))


def test_a_head_start_no_provisioning_took_ends_with_its_block(home):
    spec = load_spec(SPEC, [])
    with LocalLauncher.head_start(spec):
        [early] = marked("warm-")
        tag = early.environ()[JOB_ENV]
    assert not marked(tag)
    assert not list((home / "runs").glob("*.log"))


def test_no_head_start_where_the_nodes_have_networks_of_their_own_or_start_cold(home):
    for overrides in (["resources.network=namespaces"], ["resources.warm_workers=false"]):
        with LocalLauncher.head_start(load_spec(SPEC, overrides)):
            assert not marked("warm-")
