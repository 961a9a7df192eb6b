"""trainflow.checkpoint.catalog: committed checkpoints, the latest verified one, retention."""

from __future__ import annotations

import pytest

from trainflow.checkpoint.catalog import (
    apply_retention,
    checkpoint_prefix,
    latest_verified,
    list_committed,
    missing_or_resized,
)
from trainflow.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest
from trainflow.checkpoint.storage import LocalStorage

FILES = {"model.bin": b"m" * 64, "state.json": b'{"step": 0}'}


@pytest.fixture
def store(tmp_path) -> LocalStorage:
    return LocalStorage(tmp_path / "ckpt")


def commit(store: LocalStorage, run_id: str, step: int, committed_at: float | None = None) -> str:
    """Write a checkpoint's files, then its manifest: a committed checkpoint."""
    prefix = checkpoint_prefix(run_id, step)
    entries = []
    for name, data in FILES.items():
        store.put_if_absent(f"{prefix}/{name}", data)
        entries.append(FileEntry(name=name, size=len(data), sha256="0" * 64))
    manifest = Manifest(
        step=step,
        world_size=2,
        spec_hash="s" * 64,
        code_version="abc",
        run_id=run_id,
        files=tuple(entries),
        committed_at=float(step) if committed_at is None else committed_at,
    )
    store.put_if_absent(f"{prefix}/{MANIFEST_NAME}", manifest.to_json().encode())
    return prefix


def test_checkpoint_prefix_layout():
    assert checkpoint_prefix("run-a", 42) == "run-a/step-00000042"


def test_list_committed_oldest_first(store):
    for step in (20, 10, 30):
        commit(store, "run-a", step)
    assert [c.step for c in list_committed(store)] == [10, 20, 30]
    assert list_committed(store)[0].prefix == "run-a/step-00000010"


def test_list_committed_ignores_folders_without_manifest(store):
    commit(store, "run-a", 10)
    store.put_if_absent(f"{checkpoint_prefix('run-a', 20)}/model.bin", b"m" * 64)  # never committed
    assert [c.step for c in list_committed(store)] == [10]


def test_list_committed_ignores_unreadable_manifest(store):
    commit(store, "run-a", 10)
    prefix = checkpoint_prefix("run-a", 20)
    store.put_if_absent(f"{prefix}/model.bin", b"m" * 64)
    store.put_if_absent(f"{prefix}/{MANIFEST_NAME}", b"{not json")
    assert [c.step for c in list_committed(store)] == [10]


def test_list_committed_ignores_manifest_holding_json_null(store):
    commit(store, "run-a", 10)
    store.put_if_absent(f"{checkpoint_prefix('run-a', 20)}/{MANIFEST_NAME}", b"null")
    assert [c.step for c in list_committed(store)] == [10]


def test_latest_verified_is_the_newest_intact(store):
    commit(store, "run-a", 10)
    commit(store, "run-a", 20)
    found = latest_verified(store)
    assert found is not None and found.step == 20


def test_latest_verified_skips_newest_with_missing_file(store):
    commit(store, "run-a", 10)
    prefix = commit(store, "run-a", 20)
    (store.root / prefix / "model.bin").unlink()
    assert missing_or_resized(store, list_committed(store)[-1]) == ["model.bin: missing"]
    assert latest_verified(store).step == 10


def test_latest_verified_skips_newest_with_resized_file(store):
    commit(store, "run-a", 10)
    prefix = commit(store, "run-a", 20)
    (store.root / prefix / "state.json").write_bytes(b"{}")
    assert latest_verified(store).step == 10


def test_latest_verified_none_when_nothing_intact(store):
    assert latest_verified(store) is None
    prefix = commit(store, "run-a", 10)
    (store.root / prefix / "model.bin").unlink()
    assert latest_verified(store) is None


def test_latest_verified_prefers_latest_commit_across_runs(store):
    commit(store, "run-a", 50, committed_at=100.0)
    commit(store, "run-b", 10, committed_at=200.0)
    assert latest_verified(store).manifest.run_id == "run-b"


def test_latest_verified_restricted_to_one_run(store):
    commit(store, "run-a", 50, committed_at=100.0)
    commit(store, "run-b", 10, committed_at=200.0)
    found = latest_verified(store, run_id="run-a")
    assert found.step == 50 and found.manifest.run_id == "run-a"
    assert latest_verified(store, run_id="run-c") is None


def test_retention_keeps_newest_k_by_step(store):
    for step in (10, 20, 30, 40, 50):
        commit(store, "run-a", step, committed_at=1000.0 - step)  # commit order opposite to steps
    deleted = apply_retention(store, "run-a", keep_last=2)
    assert sorted(deleted) == [10, 20, 30]
    assert [c.step for c in list_committed(store, "run-a")] == [50, 40]
    assert not (store.root / checkpoint_prefix("run-a", 10)).exists()


def test_retention_leaves_no_manifest_of_a_deleted_checkpoint(store):
    for step in (10, 20, 30):
        commit(store, "run-a", step)
    apply_retention(store, "run-a", keep_last=2)
    manifests = [k for k in store.list() if k.endswith(MANIFEST_NAME)]
    assert manifests == ["run-a/step-00000020/manifest.json", "run-a/step-00000030/manifest.json"]
    assert not any(k.startswith("run-a/step-00000010") for k in store.list())


def test_retention_only_touches_its_run(store):
    for step in (10, 20, 30):
        commit(store, "run-a", step)
        commit(store, "run-b", step)
    assert apply_retention(store, "run-a", keep_last=2) == [10]
    assert [c.step for c in list_committed(store, "run-b")] == [10, 20, 30]


def test_retention_with_fewer_than_k_deletes_nothing(store):
    commit(store, "run-a", 10)
    assert apply_retention(store, "run-a", keep_last=3) == []
    assert [c.step for c in list_committed(store)] == [10]


@pytest.mark.parametrize("keep_last", [1, 0])
def test_retention_refuses_to_keep_fewer_than_two(store, keep_last):
    commit(store, "run-a", 10)
    commit(store, "run-a", 20)
    with pytest.raises(ValueError, match="at least 2"):
        apply_retention(store, "run-a", keep_last=keep_last)
    assert len(list_committed(store)) == 2


def test_latest_verified_of_a_run_is_its_highest_step_whatever_the_commit_clocks_say(store):
    # a retry's rank 0 on another host whose clock is behind: its newer step looks committed earlier
    commit(store, "run-a", 30, committed_at=200.0)
    commit(store, "run-a", 40, committed_at=150.0)
    assert latest_verified(store, run_id="run-a").step == 40
