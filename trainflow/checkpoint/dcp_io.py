"""DCP reading and writing the way trainflow needs it: staged copies, node-local writes, and a
metadata reader that refuses to unpickle anything but DCP's own metadata classes.

DCP's FileSystemReader loads `.metadata` with plain `pickle.load`, which runs whatever a crafted
file names. trainflow only loads a checkpoint after every file matched the manifest's sha256, and
on top of that reads `.metadata` with an unpickler that resolves only the classes DCP writes
there (tensor data itself is read by DCP with `torch.load(weights_only=True)`).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class UnsafeMetadata(pickle.UnpicklingError):
    """A `.metadata` file that names something other than DCP's metadata classes."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _METADATA_MODULES:
            found = getattr(__import__(module, fromlist=[name]), name, None)
            if isinstance(found, type) and found.__module__ == module:
                return found
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        elif (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise UnsafeMetadata(f".metadata refers to {module}.{name}, which a DCP checkpoint never needs")


def load_metadata(path: Path):
    with open(path, "rb") as handle:
        return _MetadataUnpickler(handle).load()


def files_outside(metadata: Any, allowed: set[str]) -> list[str]:
    """The files DCP's metadata would read that are not among `allowed` (plain names in the
    checkpoint folder): DCP joins each storage item's relative path to the folder, so an absolute
    path or `..` in a crafted `.metadata` would read a file the manifest never vouched for."""
    storage_data = getattr(metadata, "storage_data", None)
    if not isinstance(storage_data, dict):
        return ["(no storage items)"]
    outside = set()
    for info in storage_data.values():
        path = getattr(info, "relative_path", None)
        if not isinstance(path, str) or path not in allowed:
            outside.add(repr(path))
    return sorted(outside)


class SafeFileSystemReader(dcp.FileSystemReader):
    """FileSystemReader whose `.metadata` is read with the restricted unpickler above, and which
    reads only the files in `allowed` (the manifest's list)."""

    def __init__(self, path: str | Path, allowed: set[str]):
        super().__init__(path)
        self.allowed = set(allowed)

    def read_metadata(self, *args: Any, **kwargs: Any):
        rank = kwargs.get("rank")
        metadata = load_metadata(Path(self._get_metadata_path(rank)))
        outside = files_outside(metadata, self.allowed)
        if outside:
            raise UnsafeMetadata(f".metadata names files outside the manifest: {', '.join(outside[:5])}")
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def local_writer(folder: Path) -> dcp.FileSystemWriter:
    # No fsync: the local tier is for process crashes, which keep the page cache; after a power
    # loss a torn file fails its sha256 check and the durable copy is used instead.
    return dcp.FileSystemWriter(folder, single_file_per_rank=True, sync_files=False, thread_count=1, overwrite=True)


def make_stager() -> DefaultStager:
    """Copies to host memory, reusing the same buffers from one save to the next (pinned with CUDA)."""
    cuda = torch.cuda.is_available()
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=cuda
        )
    )


def own_files(folder: Path, rank: int) -> list[str]:
    """The DCP files rank `rank` wrote into `folder` (DCP prefixes them `__<rank>_`), plus the
    `.metadata` the coordinator (rank 0) writes."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name.startswith(f"__{rank}_"))
    if rank == 0 and (folder / ".metadata").is_file():
        names.append(".metadata")
    return names
