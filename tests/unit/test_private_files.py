"""Worker configs and run folders are readable by their owner only, whatever the umask."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from trainflow.private_files import UnsafeFolder, open_private, private_folder, write_private
from trainflow.worker_config import WorkerConfig


@pytest.fixture
def permissive_umask():
    previous = os.umask(0)  # the worst case: nothing masked
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def config(tmp_path: Path) -> WorkerConfig:
    return WorkerConfig(
        run_id="r",
        attempt=1,
        node=0,
        status_address="127.0.0.1:1",
        status_token="s3cr3t-token",
        checkpoint_uri=str(tmp_path / "ck"),
        every_steps=5,
        total_steps=10,
        seed=0,
        spec_hash="0" * 64,
        code_version="test",
        comm_backend="gloo",
        collective_timeout_s=60,
        heartbeat_interval_s=1,
        orchestrator_timeout_s=30,
        node_scratch=str(tmp_path / "node-0"),
    )


def test_worker_config_and_its_folders_are_private(tmp_path, permissive_umask):
    path = config(tmp_path).write(tmp_path / "runs" / "abc" / "attempt-1" / "node-0.json")
    assert mode(path) == 0o600
    for folder in (tmp_path / "runs", tmp_path / "runs" / "abc", path.parent):
        assert mode(folder) == 0o700, folder
    assert WorkerConfig(**json.loads(path.read_text())).status_token == "s3cr3t-token"


def test_a_world_readable_file_in_the_way_is_replaced_not_reused(tmp_path, permissive_umask):
    path = tmp_path / "node-0.json"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "new")
    assert (path.read_text(), mode(path)) == ("new", 0o600)


def test_a_symlink_in_the_way_is_not_followed(tmp_path, permissive_umask):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = tmp_path / "node-0.log"
    link.symlink_to(target)
    with pytest.raises(OSError):
        os.close(open_private(link, append=True))
    assert target.read_text() == "keep"


def test_private_folder_leaves_existing_parents_alone(tmp_path, permissive_umask):
    tmp_path.chmod(0o755)
    private_folder(tmp_path / "runs" / "abc")
    assert mode(tmp_path) == 0o755 and mode(tmp_path / "runs" / "abc") == 0o700


needs_nobody = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser")


@pytest.fixture
def shared_tmp():
    """A folder every user can write to, like the system's temporary folder."""
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_nobody
def test_a_folder_another_user_made_first_is_refused_not_used(shared_tmp):
    planted = shared_tmp / "trainflow-run"
    subprocess.run(["runuser", "-u", "nobody", "--", "mkdir", "-m", "0777", str(planted)], check=True)
    with pytest.raises(UnsafeFolder, match="not by this user"):
        private_folder(planted)
    with pytest.raises(UnsafeFolder, match="anyone can replace"):
        private_folder(planted / "node-0")  # nor a folder made inside it
    assert list(planted.iterdir()) == []


def test_a_link_or_a_folder_others_can_write_is_refused_and_a_readable_one_narrowed(tmp_path, permissive_umask):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeFolder, match="symbolic link"):
        private_folder(tmp_path / "link")
    (tmp_path / "open").mkdir(mode=0o777)
    with pytest.raises(UnsafeFolder, match="others can write"):
        private_folder(tmp_path / "open")
    (tmp_path / "readable").mkdir(mode=0o755)
    assert mode(private_folder(tmp_path / "readable")) == 0o700


def test_what_a_run_keeps_in_a_new_home_is_its_owners_alone(tmp_path, monkeypatch, permissive_umask):
    from trainflow.checkpoint.storage import open_storage
    from trainflow.home import default_tracking_uri, resolve_checkpoint_uri, runs_root
    from trainflow.orchestrator.orphans import MARKER, write_marker
    from trainflow.reporting.tracking import Tracker

    home = tmp_path / "home"
    monkeypatch.setenv("TRAINFLOW_HOME", str(home))
    Tracker(default_tracking_uri()).experiment_id("probe")
    write_marker(runs_root() / "run-1", "run-1", "mlflow-run", default_tracking_uri(), None)
    storage = open_storage(resolve_checkpoint_uri("checkpoints/digits"))
    storage.check()
    storage.put_if_absent("run-1/step-00000001/manifest.json", b"{}")

    assert mode(home) == mode(runs_root()) == mode(runs_root() / "run-1") == 0o700
    assert mode(home / "mlflow.db") == mode(runs_root() / "run-1" / MARKER) == 0o600
    for folder in (home / "checkpoints", home / "checkpoints/digits", home / "checkpoints/digits/run-1"):
        assert mode(folder) == 0o700, folder


def test_a_node_scratch_is_made_in_its_pods_volume_and_in_no_other_open_folder(tmp_path, permissive_umask):
    """A pod's emptyDir is 0777 without the sticky bit (the kubelet makes it so), yet only this
    pod mounts it: the node's scratch is made there when the worker config names it the volume."""
    volume = tmp_path / "scratch"
    volume.mkdir(mode=0o777)
    node = replace(config(tmp_path), node_scratch=str(volume / "node"))
    with pytest.raises(UnsafeFolder, match="anyone can replace"):
        node.make_node_scratch()  # an open folder that is not the pod's own
    assert list(volume.iterdir()) == []
    made = replace(node, scratch_volume=str(volume)).make_node_scratch()
    assert made == volume / "node" and mode(made) == 0o700
    other = tmp_path / "other"
    other.mkdir(mode=0o777)
    with pytest.raises(UnsafeFolder, match="anyone can replace"):  # the volume vouches for itself alone
        replace(node, node_scratch=str(other / "node"), scratch_volume=str(volume)).make_node_scratch()
