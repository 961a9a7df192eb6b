"""trainflow.checkpoint.plain_copies: a plain script's own checkpoint folder copied to the store
only at rest, committed with a manifest, and restored from the newest copy that verifies."""

from __future__ import annotations

import os
from pathlib import Path

from trainflow.checkpoint.catalog import latest_verified
from trainflow.checkpoint.plain_copies import (
    CopyIdentity,
    folder_state,
    read_restores,
    record_restore,
    restore_newest,
    take_copy,
)
from trainflow.checkpoint.storage import LocalStorage

IDENTITY = CopyIdentity("run-1", 2, "spec", "code")


def folder_with(path: Path, **files: bytes) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def test_copies_are_numbered_committed_and_verified(tmp_path):
    storage = LocalStorage(tmp_path / "store")
    out = folder_with(tmp_path / "out", **{"ckpt.pt": b"a" * 100, "config.json": b"{}"})
    first = take_copy(out, folder_state(out), storage, IDENTITY, tmp_path / "aside")
    (out / "ckpt.pt").write_bytes(b"b" * 120)
    second = take_copy(out, folder_state(out), storage, IDENTITY, tmp_path / "aside")
    assert (first.prefix, second.prefix) == ("run-1/step-00000001", "run-1/step-00000002")
    assert [f.name for f in second.manifest.files] == ["ckpt.pt", "config.json"]
    assert latest_verified(storage, "run-1").prefix == second.prefix
    assert not (tmp_path / "aside").exists()


def test_a_file_written_while_it_is_copied_is_never_taken_as_complete(tmp_path):
    storage = LocalStorage(tmp_path / "store")
    out = folder_with(tmp_path / "out", **{"ckpt.pt": b"a" * 100})
    seen = folder_state(out)
    with open(out / "ckpt.pt", "ab") as writing:  # the script goes on writing after the scan
        writing.write(b"more")
    assert take_copy(out, seen, storage, IDENTITY, tmp_path / "aside") is None
    assert storage.list() == []


def test_a_removed_folder_is_restored_and_a_damaged_copy_gives_way_to_an_older_one(tmp_path):
    storage = LocalStorage(tmp_path / "store")
    out = folder_with(tmp_path / "out", **{"ckpt.pt": b"old"})
    older = take_copy(out, folder_state(out), storage, IDENTITY, tmp_path / "aside")
    (out / "ckpt.pt").write_bytes(b"newer")
    newer = take_copy(out, folder_state(out), storage, IDENTITY, tmp_path / "aside")
    (tmp_path / "store" / newer.prefix / "ckpt.pt").write_bytes(b"newes!")  # same size, other bytes
    for name in os.listdir(out):
        (out / name).unlink()
    out.rmdir()
    restored = restore_newest(storage, newer.prefix, out)
    assert restored.prefix == older.prefix and (out / "ckpt.pt").read_bytes() == b"old"
    assert restored.rejected == [
        {"prefix": newer.prefix, "reason": "ckpt.pt: size or sha256 differs from the manifest"}
    ]
    assert sorted(os.listdir(out)) == ["ckpt.pt"]  # nothing half downloaded left beside it
    record_restore(storage, "run-1", 2, 0, restored)
    assert read_restores(storage, "run-1", 2)[0]["restored"] == older.prefix


def test_a_damaged_copy_is_passed_over_though_the_folder_still_holds_its_bytes(tmp_path):
    storage = LocalStorage(tmp_path / "store")
    out = folder_with(tmp_path / "out", **{"ckpt.pt": b"intact"})
    copy = take_copy(out, folder_state(out), storage, IDENTITY, tmp_path / "aside")
    (tmp_path / "store" / copy.prefix / "ckpt.pt").write_bytes(b"broken")
    assert restore_newest(storage, copy.prefix, out).prefix is None  # nothing older to fall back to
