"""Retention keeps exactly what it promises: the newest K, every N-th step, and never the newest
verified checkpoint; and interrupted uploads at committed steps are cleaned up."""

from __future__ import annotations

import pytest

from trainflow.checkpoint.catalog import (
    abort_stale_uploads,
    apply_retention,
    checkpoint_prefix,
    list_committed,
    retained_steps,
    run_of,
    step_of,
)
from trainflow.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest
from trainflow.checkpoint.storage import PARTIAL, LocalStorage

DATA = b"m" * 64


@pytest.fixture
def store(tmp_path) -> LocalStorage:
    return LocalStorage(tmp_path / "ckpt")


def commit(store: LocalStorage, run_id: str, step: int) -> str:
    prefix = checkpoint_prefix(run_id, step)
    store.put_if_absent(f"{prefix}/model.bin", DATA)
    manifest = Manifest(
        step=step,
        world_size=2,
        spec_hash="s" * 64,
        code_version="abc",
        run_id=run_id,
        files=(FileEntry("model.bin", len(DATA), "0" * 64),),
        committed_at=float(step),
    )
    store.put_if_absent(f"{prefix}/{MANIFEST_NAME}", manifest.to_json().encode())
    return prefix


def steps(store: LocalStorage, run_id: str = "run-a") -> list[int]:
    return sorted(c.step for c in list_committed(store, run_id))


@pytest.mark.parametrize(
    "keep_last, every, protect, expected",
    [
        (2, 0, set(), {90, 100}),
        (3, 0, set(), {80, 90, 100}),
        (2, 50, set(), {50, 90, 100}),
        (2, 30, set(), {30, 60, 90, 100}),
        (2, 0, {40}, {40, 90, 100}),
        (2, 50, {50}, {50, 90, 100}),
        (20, 0, set(), set(range(10, 101, 10))),
    ],
)
def test_retained_steps(keep_last, every, protect, expected):
    assert retained_steps(list(range(10, 101, 10)), keep_last, every, protect) == expected


def test_retained_steps_refuses_keeping_fewer_than_two():
    with pytest.raises(ValueError, match="at least 2"):
        retained_steps([10, 20], 1)
    with pytest.raises(ValueError, match="keep_every_steps"):
        retained_steps([10, 20], 2, -5)


def test_keep_every_n_steps_survives_keep_last(store):
    for step in range(10, 101, 10):
        commit(store, "run-a", step)
    deleted = apply_retention(store, "run-a", keep_last=2, keep_every_steps=40)
    assert steps(store) == [40, 80, 90, 100]
    assert sorted(deleted) == [10, 20, 30, 50, 60, 70]
    assert not (store.root / checkpoint_prefix("run-a", 50)).exists()


def test_newest_verified_is_never_deleted(store):
    for step in (10, 20, 30, 40):
        commit(store, "run-a", step)
    for step in (30, 40):  # the two newest lost a file: only 20 can still be restored
        (store.root / checkpoint_prefix("run-a", step) / "model.bin").unlink()
    apply_retention(store, "run-a", keep_last=2)
    assert steps(store) == [20, 30, 40]


def test_retention_applied_again_deletes_nothing_more(store):
    for step in (10, 20, 30, 40):
        commit(store, "run-a", step)
    apply_retention(store, "run-a", keep_last=2)
    assert apply_retention(store, "run-a", keep_last=2) == []
    assert steps(store) == [30, 40]


def test_stale_uploads_up_to_a_committed_step_are_aborted(store):
    commit(store, "run-a", 20)
    for step in (10, 20, 30):  # partial files of interrupted writers
        folder = store.root / checkpoint_prefix("run-a", step)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"shard{PARTIAL}999-1").write_bytes(b"half")
    other = store.root / checkpoint_prefix("run-b", 10)
    other.mkdir(parents=True)
    (other / f"shard{PARTIAL}999-1").write_bytes(b"half")

    aborted = abort_stale_uploads(store, "run-a", up_to_step=20)
    assert sorted(step_of(key) for key in aborted) == [10, 20]
    left = [i.key for i in store.list_incomplete()]
    assert [step_of(k) for k in left if k.startswith("run-a/")] == [30]  # may still be in flight
    assert any(k.startswith("run-b/") for k in left)  # another run's uploads are not ours to judge


@pytest.mark.parametrize(
    "key, step",
    [
        ("run-a/step-00000040/manifest.json", 40),
        ("run-a/step-00000040", 40),
        ("run-a/step-00000040-a2-3/__0_0.distcp", 40),
        ("prefix/run-a/step-00001000/x", 1000),
        ("run-a/notes.txt", None),
        ("run-a/step-40/x", None),
    ],
)
def test_step_of(key, step):
    assert step_of(key) == step


def test_run_of():
    assert run_of("run-a/step-00000040") == "run-a"
    assert run_of("deep/run-a/step-00000040/") == "deep/run-a"
    assert run_of("step-00000040") == ""


def test_retention_lagging_behind_the_commits_never_deletes_what_is_not_yet_verified(store):
    # the workers committed five checkpoints before the snapshot task verified the first; it then
    # verifies them in commit order, applying retention after each, as tasks/snapshot.py does
    for step in range(10, 51, 10):
        commit(store, "run-a", step)
    unverifiable = []
    for step in range(10, 51, 10):
        prefix = checkpoint_prefix("run-a", step)
        if store.size(f"{prefix}/{MANIFEST_NAME}") is None or store.size(f"{prefix}/model.bin") != len(DATA):
            unverifiable.append(step)
        apply_retention(store, "run-a", keep_last=2, up_to_step=step)
    assert unverifiable == []
    assert steps(store) == [40, 50]


def test_retention_up_to_a_step_leaves_newer_checkpoints_alone(store):
    for step in range(10, 51, 10):
        commit(store, "run-a", step)
    assert apply_retention(store, "run-a", keep_last=2, up_to_step=30) == [10]
    assert steps(store) == [20, 30, 40, 50]
