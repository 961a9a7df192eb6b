"""A plain script's own checkpoint folder, made durable from its node: copies in the checkpoint
store with trainflow's manifest, and the newest verified copy put back before a retry.

A copy is taken only of a folder at rest: its files (names, sizes, modification times) the same
over `QUIET_SCANS` scans `SCAN_S` apart, and still the same once they are copied aside into the
node's scratch. The copies aside are hashed and uploaded, and the manifest, written last with a
create-only write, commits the copy: a file the script is still writing changes between scans or
while it is copied, and is never taken as complete. Copies are numbered 1, 2, 3... in the run's
folder (`<run id>/step-<8 digits>/`, the number in the manifest's `step`), so the catalog,
verification and retention of trainflow's own checkpoints apply unchanged.

Restoring downloads every file of a copy beside its target, checks its size and sha256 against
the manifest, then renames it into place (nodes that share a folder put the same bytes there, with the
same time); a copy that does not verify gives way to the next older one.
What each node restored, and what it passed over and why, goes to the store as a small record
(`<run id>/restores/attempt-<k>-node-<n>.json`) for the orchestrator to read.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainflow.checkpoint.catalog import Committed, checkpoint_prefix, list_committed, read_manifest, step_of
from trainflow.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, ManifestError, describe_file, sha256_file
from trainflow.checkpoint.storage import AlreadyExists, Storage

SCAN_S = 0.5
QUIET_SCANS = 2
RESTORES = "restores"
PARTIAL_PREFIX = ".trainflow-restoring-"

FolderState = dict[str, tuple[int, int]]  # file name -> (size, modification time in ns)


def script_folder(checkpoint_dir: str) -> Path:
    """The folder as the script sees it: relative to its working directory (the agent's), or absolute."""
    return Path(checkpoint_dir).expanduser().absolute()


def folder_state(folder: Path) -> FolderState:
    """The folder's files at this moment (its top level: a copy holds plain file names only)."""
    state: FolderState = {}
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return state
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False) and not entry.name.startswith(PARTIAL_PREFIX):
                info = entry.stat(follow_symlinks=False)
                state[entry.name] = (info.st_size, info.st_mtime_ns)
        except FileNotFoundError:
            continue  # removed between the listing and the look
    return state


@dataclass(frozen=True)
class CopyIdentity:
    """What a copy's manifest says besides its files."""

    run_id: str
    world_size: int
    spec_hash: str
    code_version: str


def next_number(storage: Storage, run_id: str) -> int:
    numbers = [step_of(key) for key in storage.list(run_id) if key.endswith(f"/{MANIFEST_NAME}")]
    return max((n for n in numbers if n is not None), default=0) + 1


def take_copy(
    folder: Path, state: FolderState, storage: Storage, identity: CopyIdentity, aside: Path
) -> Committed | None:
    """Copy the folder's files aside, and commit them as the run's next copy if none changed
    meanwhile; None when one did (the script is writing: the next quiet moment will do)."""
    shutil.rmtree(aside, ignore_errors=True)
    aside.mkdir(parents=True)
    try:
        for name in state:
            shutil.copyfile(folder / name, aside / name)
        if folder_state(folder) != state:
            return None
        files = tuple(describe_file(aside / name) for name in sorted(state))
        while True:
            prefix = checkpoint_prefix(identity.run_id, next_number(storage, identity.run_id))
            storage.upload_many([(aside / entry.name, f"{prefix}/{entry.name}") for entry in files])
            manifest = Manifest(
                step=step_of(prefix) or 0,
                world_size=identity.world_size,
                spec_hash=identity.spec_hash,
                code_version=identity.code_version,
                run_id=identity.run_id,
                files=files,
            )
            try:
                storage.put_if_absent(f"{prefix}/{MANIFEST_NAME}", manifest.to_json().encode())
            except AlreadyExists:
                continue  # numbered by another writer meanwhile: the next number
            return Committed(prefix, manifest)
    except FileNotFoundError:
        return None  # a file went away while it was copied
    finally:
        shutil.rmtree(aside, ignore_errors=True)


@dataclass
class Restored:
    """What one node restored before an attempt."""

    prefix: str | None = None  # the copy now in the folder; None: none verified (or none asked for)
    rejected: list[dict] = field(default_factory=list)  # {prefix, reason} of each copy passed over


def restore_newest(storage: Storage, chosen: str, folder: Path) -> Restored:
    """Put `chosen` (a copy's prefix) into `folder`, or the newest older copy of its run that verifies."""
    restored = Restored()
    older = sorted(
        (c for c in list_committed(storage, chosen.rsplit("/", 1)[0]) if c.prefix != chosen),
        key=lambda c: c.step,
        reverse=True,
    )
    chosen_step = step_of(chosen + "/")
    candidates = [chosen, *(c.prefix for c in older if chosen_step is None or c.step < chosen_step)]
    for prefix in candidates:
        try:
            manifest = read_manifest(storage, prefix)
            _restore(storage, prefix, manifest, folder)
        except ManifestError as exc:
            restored.rejected.append({"prefix": prefix, "reason": str(exc)})
            continue
        restored.prefix = prefix
        return restored
    return restored


def _restore(storage: Storage, prefix: str, manifest: Manifest, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for entry in manifest.files:
        target = folder / entry.name
        # downloaded even when the folder holds the same bytes: the copy in the store is what a
        # replacement node would get, and a damaged one must be found and passed over now
        partial = folder / f"{PARTIAL_PREFIX}{entry.name}-{os.getpid()}"
        try:
            storage.download(f"{prefix}/{entry.name}", partial)
            if not _matches(partial, entry):
                raise ManifestError(f"{entry.name}: size or sha256 differs from the manifest")
            # every node that restores the same copy gives the file the same time: a folder shared
            # by nodes looks unchanged to the node that copies it
            os.utime(partial, ns=(int(manifest.committed_at * 1e9),) * 2)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)


def _matches(path: Path, entry: FileEntry) -> bool:
    try:
        return path.stat().st_size == entry.size and sha256_file(path) == entry.sha256
    except FileNotFoundError:
        return False


def record_restore(storage: Storage, run_id: str, attempt: int, node: int, restored: Restored) -> None:
    key = f"{run_id}/{RESTORES}/attempt-{attempt:05d}-node-{node}.json"
    record = {
        "attempt": attempt,
        "node": node,
        "restored": restored.prefix,
        "rejected": restored.rejected,
        "t": time.time(),
    }
    try:
        storage.put_if_absent(key, json.dumps(record).encode())
    except AlreadyExists:
        pass  # a warm agent restarted for the same attempt: the first record stands


def read_restores(storage: Storage, run_id: str, attempt: int) -> list[dict]:
    """Every node's restore record of an attempt, by node."""
    found = []
    for key in storage.list(f"{run_id}/{RESTORES}"):
        if f"/attempt-{attempt:05d}-node-" in key:
            try:
                found.append(json.loads(storage.read(key)))
            except ValueError:
                continue
    return sorted(found, key=lambda r: r.get("node", 0))
