"""Worker configs and run folders are readable by their owner only, whatever the umask."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from trainflow.private_files import open_private, private_folder, write_private
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
        run_id="r", attempt=1, node=0, status_address="127.0.0.1:1", status_token="s3cr3t-token",
        checkpoint_uri=str(tmp_path / "ck"), every_steps=5, total_steps=10, seed=0, spec_hash="0" * 64,
        code_version="test", comm_backend="gloo", collective_timeout_s=60, heartbeat_interval_s=1,
        orchestrator_timeout_s=30, node_scratch=str(tmp_path / "node-0"),
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
