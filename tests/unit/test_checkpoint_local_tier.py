"""The node-local tier: what a node holds, its local commit, and keeping the newest two."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trainflow.checkpoint.keep_local import keep_newer_local_checkpoints, newer_local_checkpoints
from trainflow.checkpoint.local_tier import LocalTier
from trainflow.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest
from trainflow.checkpoint.storage import PARTIAL, AlreadyExists


@pytest.fixture
def tier(tmp_path) -> LocalTier:
    return LocalTier(tmp_path / "checkpoints")


def entry(name: str, data: bytes) -> FileEntry:
    return FileEntry(name, len(data), hashlib.sha256(data).hexdigest())


def save(tier: LocalTier, step: int, save_id: str = "a1-1", commit: bool = True, at: float | None = None) -> str:
    """What one node does for one save: its ranks' files, then (if every rank succeeded) the manifest."""
    prefix = tier.prefix("run-a", step, save_id)
    folder = tier.folder(prefix)
    folder.mkdir(parents=True)
    mine = {"__0_0.distcp": b"zero" * 10, "rank-0.json": b"{}"}
    for name, data in mine.items():
        (folder / name).write_bytes(data)
    theirs = entry("__1_0.distcp", b"one" * 10)  # written on another node
    if commit:
        files = tuple(sorted([*(entry(n, d) for n, d in mine.items()), theirs], key=lambda e: e.name))
        manifest = Manifest(
            step=step,
            world_size=2,
            spec_hash="s" * 64,
            code_version="c",
            run_id="run-a",
            files=files,
            committed_at=at if at is not None else float(step),
        )
        tier.commit(prefix, manifest)
    return prefix


def test_inventory_lists_what_the_node_holds(tier):
    prefix = save(tier, 20)
    (tier.folder(prefix) / f"__0_1.distcp{PARTIAL}1-2").write_bytes(b"half")  # being written
    [held] = tier.inventory("run-a")
    assert held.prefix == prefix and held.step == 20
    assert held.present == {"__0_0.distcp": 40, "rank-0.json": 2}
    assert held.manifest().step == 20
    assert {f.name for f in held.manifest().files} == {"__0_0.distcp", "__1_0.distcp", "rank-0.json"}


def test_uncommitted_folder_is_held_but_not_committed(tier):
    save(tier, 10)
    save(tier, 20, commit=False)
    assert [h.step for h in tier.inventory("run-a")] == [10, 20]
    assert [h.step for h in tier.committed("run-a")] == [10]
    assert tier.inventory("run-a")[1].manifest() is None


def test_unreadable_manifest_is_not_committed(tier):
    prefix = save(tier, 10, commit=False)
    (tier.folder(prefix) / MANIFEST_NAME).write_text("{torn")
    assert tier.committed("run-a") == []


def test_commit_is_create_only_but_idempotent(tier):
    prefix = save(tier, 10)
    manifest = tier.committed("run-a")[0].manifest()
    tier.commit(prefix, manifest)  # the same manifest again: fine
    other = Manifest(**{**manifest.__dict__, "step": 11})
    with pytest.raises(AlreadyExists):
        tier.commit(prefix, other)


def test_prune_keeps_the_newest_and_the_protected_and_drops_failed_saves(tier):
    for step in (10, 20, 30):
        save(tier, step)
    failed = save(tier, 35, commit=False)
    newest = save(tier, 40)
    removed = tier.prune("run-a", keep=2, protect={newest})
    assert [h.step for h in tier.inventory("run-a")] == [30, 40]
    assert failed in removed and not tier.folder(failed).exists()


def test_two_saves_of_one_step_are_two_folders_newest_commit_last(tier):
    first = save(tier, 40, "a1-4", at=100.0)
    second = save(tier, 40, "a2-1", at=200.0)
    assert first != second
    assert [h.prefix for h in tier.committed("run-a")] == [first, second]


def test_other_runs_are_invisible(tier):
    save(tier, 10)
    assert tier.inventory("run-b") == [] and tier.committed("run-b") == []
    assert tier.prune("run-b", keep=2) == []
    assert len(tier.inventory("run-a")) == 1


def test_discard_removes_the_manifest_first(tier):
    prefix = save(tier, 10)
    tier.discard(prefix)
    assert not tier.folder(prefix).exists()
    assert tier.committed("run-a") == []


def test_the_newest_state_only_on_the_nodes_is_moved_out_of_the_scratch_not_deleted(tmp_path):
    scratch = tmp_path / "scratch"
    tiers = [LocalTier(scratch / f"node-{n}" / "checkpoints") for n in range(2)]
    for tier in tiers:
        save(tier, 30)
        save(tier, 40)
        save(tier, 50, commit=False)  # a save that never committed is not state anyone can load
    kept = keep_newer_local_checkpoints(scratch, "run-a", durable_step=30, destination=tmp_path / "kept")
    assert sorted(Path(p).relative_to(tmp_path / "kept").as_posix() for p in kept) == [
        "node-0/step-00000040-a1-1",
        "node-1/step-00000040-a1-1",
    ]
    assert all((Path(p) / MANIFEST_NAME).is_file() for p in kept)
    assert [h.step for h in tiers[0].committed("run-a")] == [30]  # moved, not copied


def test_nothing_is_kept_once_the_newest_local_state_is_durable(tmp_path):
    scratch = tmp_path / "scratch"
    save(LocalTier(scratch / "node-0" / "checkpoints"), 40)
    assert keep_newer_local_checkpoints(scratch, "run-a", durable_step=40, destination=tmp_path / "kept") == []
    assert newer_local_checkpoints(scratch, "run-a", durable_step=None) == [
        scratch / "node-0" / "checkpoints" / "run-a" / "step-00000040-a1-1"
    ]
