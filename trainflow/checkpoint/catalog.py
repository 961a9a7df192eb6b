"""What the checkpoint store holds: committed checkpoints, the latest verified one, retention.

Layout under the checkpoint URI: `<run_id>/step-<8 digits>/<files>` with `manifest.json` last.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.checkpoint.manifest import MANIFEST_NAME, Manifest, ManifestError
from trainflow.checkpoint.storage import Storage, StorageError


@dataclass(frozen=True)
class Committed:
    prefix: str
    manifest: Manifest

    @property
    def step(self) -> int:
        return self.manifest.step


def checkpoint_prefix(run_id: str, step: int) -> str:
    return f"{run_id}/step-{step:08d}"


def read_manifest(storage: Storage, prefix: str) -> Manifest:
    try:
        return Manifest.from_json(storage.read(f"{prefix}/{MANIFEST_NAME}"))
    except StorageError as exc:
        raise ManifestError(str(exc)) from None


def list_committed(storage: Storage, run_id: str | None = None) -> list[Committed]:
    """Checkpoints with a readable manifest, oldest commit first; uncommitted folders are ignored."""
    found = []
    for key in storage.list(run_id or ""):
        if not key.endswith(f"/{MANIFEST_NAME}"):
            continue
        prefix = key.removesuffix(f"/{MANIFEST_NAME}")
        try:
            found.append(Committed(prefix, read_manifest(storage, prefix)))
        except ManifestError:
            continue
    return sorted(found, key=lambda c: (c.manifest.committed_at, c.step))


def missing_or_resized(storage: Storage, checkpoint: Committed) -> list[str]:
    """Cheap remote verification: every listed file exists with its recorded size."""
    problems = []
    for entry in checkpoint.manifest.files:
        size = storage.size(f"{checkpoint.prefix}/{entry.name}")
        if size is None:
            problems.append(f"{entry.name}: missing")
        elif size != entry.size:
            problems.append(f"{entry.name}: size {size} != {entry.size}")
    return problems


def latest_verified(storage: Storage, run_id: str | None = None) -> Committed | None:
    """The newest committed checkpoint (of one run, or of any) whose files are all present."""
    for checkpoint in reversed(list_committed(storage, run_id)):
        if not missing_or_resized(storage, checkpoint):
            return checkpoint
    return None


def apply_retention(storage: Storage, run_id: str, keep_last: int) -> list[int]:
    """Delete all but the newest `keep_last` committed checkpoints of a run; returns deleted steps.

    The manifest goes first so a half-deleted checkpoint is never mistaken for a committed one.
    """
    if keep_last < 2:
        raise ValueError("keep_last must be at least 2: the newest checkpoint may still be in use")
    committed = sorted(list_committed(storage, run_id), key=lambda c: c.step)
    doomed = committed[:-keep_last]
    for checkpoint in doomed:
        storage.delete([f"{checkpoint.prefix}/{MANIFEST_NAME}"])
        storage.delete([f"{checkpoint.prefix}/{entry.name}" for entry in checkpoint.manifest.files])
    return [c.step for c in doomed]
