"""A checkpoint is never loaded with arbitrary unpickling, and a manifest cannot point outside its
folder; batch transfers and interrupted-write clean-up of the local store."""

from __future__ import annotations

import hashlib
import json
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainflow.checkpoint.dcp_io import SafeFileSystemReader, UnsafeMetadata, files_outside, load_metadata, own_files
from trainflow.checkpoint.manifest import FileEntry, Manifest, ManifestError, describe_file, verify_files
from trainflow.checkpoint.storage import PARTIAL, Incomplete, LocalStorage, StorageError


@pytest.fixture
def saved(tmp_path):
    """A real DCP checkpoint (one process, no process group)."""
    tensors = {
        "model.weight": torch.randn(4, 3),
        "model.steps": torch.tensor(7, dtype=torch.int64),
        "optim.momentum": torch.randn(4, 3, dtype=torch.float64),
        "half": torch.ones(2, dtype=torch.bfloat16),
    }
    folder = tmp_path / "ckpt"
    dcp.save(tensors, storage_writer=dcp.FileSystemWriter(folder))
    return folder, tensors


def test_real_metadata_loads_with_the_restricted_unpickler(saved):
    folder, tensors = saved
    metadata = load_metadata(folder / ".metadata")
    assert set(metadata.state_dict_metadata) == set(tensors)


def test_dcp_load_through_the_safe_reader(saved):
    folder, tensors = saved
    into = {key: torch.zeros_like(value) for key, value in tensors.items()}
    dcp.load(into, storage_reader=SafeFileSystemReader(folder, names_in(folder)))
    assert all(torch.equal(into[key], tensors[key]) for key in tensors)


def names_in(folder) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_metadata_pointing_outside_the_checkpoint_is_refused(saved, tmp_path):
    folder, tensors = saved
    outside = tmp_path / "outside.distcp"
    outside.write_bytes((folder / "__0_0.distcp").read_bytes())
    metadata = load_metadata(folder / ".metadata")
    for info in metadata.storage_data.values():
        info.relative_path = str(outside)  # an absolute path: DCP would read it as is
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    assert files_outside(load_metadata(folder / ".metadata"), names_in(folder)) == [repr(str(outside))]
    into = {key: torch.zeros_like(value) for key, value in tensors.items()}
    with pytest.raises(CheckpointException, match="outside the manifest"):
        dcp.load(into, storage_reader=SafeFileSystemReader(folder, names_in(folder)))
    assert all(not value.any() for value in into.values())  # nothing was read from the outside file


class Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize(
    "payload", [Exploit(), {"a": pickle.Unpickler}, [print]], ids=["os.system", "class", "builtin"]
)
def test_metadata_naming_anything_else_is_refused(saved, payload):
    folder, _ = saved
    (folder / ".metadata").write_bytes(pickle.dumps(payload))
    with pytest.raises(UnsafeMetadata):
        load_metadata(folder / ".metadata")
    with pytest.raises(CheckpointException, match="never needs"):
        dcp.load(
            {"half": torch.zeros(2, dtype=torch.bfloat16)},
            storage_reader=SafeFileSystemReader(folder, names_in(folder)),
        )


def test_own_files_are_the_ranks_shards_and_the_coordinators_metadata(saved):
    folder, _ = saved
    assert own_files(folder, 0) == ["__0_0.distcp", ".metadata"]
    assert own_files(folder, 1) == []


def manifest_with(name: str, size: int = 1, sha: str = "0" * 64) -> str:
    raw = Manifest(
        step=1, world_size=1, spec_hash="s", code_version="c", run_id="r", files=(FileEntry("ok", 1, "0" * 64),)
    ).to_json()
    data = json.loads(raw)
    data["files"] = [{"name": name, "size": size, "sha256": sha}]
    return json.dumps(data)


@pytest.mark.parametrize("name", ["../escape", "a/b", "/abs", "..", ".", "", "x\\y"])
def test_manifest_file_names_cannot_leave_the_folder(name):
    with pytest.raises(ManifestError, match="unsafe file name"):
        Manifest.from_json(manifest_with(name))


@pytest.mark.parametrize("size, sha", [(-1, "0" * 64), ("12", "0" * 64), (True, "0" * 64), (1, "abc")])
def test_manifest_sizes_and_digests_are_checked(size, sha):
    with pytest.raises(ManifestError):
        Manifest.from_json(manifest_with("f", size, sha))


def test_verify_a_subset(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(name.encode() * 1000)
    manifest = Manifest(
        step=1,
        world_size=1,
        spec_hash="s",
        code_version="c",
        run_id="r",
        files=tuple(describe_file(tmp_path / n) for n in ("a", "b", "c")),
    )
    (tmp_path / "c").write_bytes(b"x" * 1000)
    assert verify_files(manifest, tmp_path) == ["c: sha256 mismatch"]
    assert verify_files(manifest, tmp_path, names={"a", "b"}) == []
    assert verify_files(manifest, tmp_path, names={"c"}, workers=1) == ["c: sha256 mismatch"]


def test_local_store_moves_batches(tmp_path):
    store = LocalStorage(tmp_path / "store")
    sources = []
    for index in range(3):
        path = tmp_path / f"f{index}"
        path.write_bytes(os.urandom(1000 + index))
        sources.append(path)
    store.upload_many([(p, f"run/step-00000001/{p.name}") for p in sources])
    store.download_many([(f"run/step-00000001/{p.name}", tmp_path / "back" / p.name) for p in sources])
    for path in sources:
        assert (tmp_path / "back" / path.name).read_bytes() == path.read_bytes()
    assert store.list_incomplete() == []


def test_local_upload_of_a_missing_file_is_a_storage_error(tmp_path):
    store = LocalStorage(tmp_path / "store")
    with pytest.raises(StorageError, match="not found"):
        store.upload(tmp_path / "nope", "run/x")
    assert store.list_incomplete() == []


def test_local_partial_files_are_listed_and_aborted(tmp_path):
    store = LocalStorage(tmp_path / "store")
    store.put_if_absent("run/step-00000001/done", b"x")
    (store.root / "run" / "step-00000001" / f"shard{PARTIAL}42-1").write_bytes(b"half")
    found = store.list_incomplete("run")
    assert found == [Incomplete(f"run/step-00000001/shard{PARTIAL}42-1")]
    store.abort_incomplete(found)
    assert store.list_incomplete() == [] and store.list() == ["run/step-00000001/done"]


def test_describe_matches_hashlib(tmp_path):
    data = os.urandom(9 << 20)  # more than two read chunks
    (tmp_path / "big").write_bytes(data)
    assert describe_file(tmp_path / "big").sha256 == hashlib.sha256(data).hexdigest()
