"""What the checkpoint store holds: committed checkpoints, the latest verified one, retention.

Layout under the checkpoint URI: `<run_id>/step-<8 digits>/<files>` with `manifest.json` last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainflow.checkpoint.manifest import MANIFEST_NAME, Manifest, ManifestError
from trainflow.checkpoint.storage import Storage, StorageError

STEP_FOLDER = re.compile(r"(?:^|/)step-(\d{8})(?:-[^/]*)?(?:/|$)")


@dataclass(frozen=True)
class Committed:
    prefix: str
    manifest: Manifest

    @property
    def step(self) -> int:
        return self.manifest.step


def checkpoint_prefix(run_id: str, step: int) -> str:
    return f"{run_id}/step-{step:08d}"


def step_of(key: str) -> int | None:
    """The step a key belongs to (`<run>/step-00000040/...` -> 40), None outside a step folder."""
    match = STEP_FOLDER.search(key)
    return int(match.group(1)) if match else None


def run_of(prefix: str) -> str:
    """The run folder of a checkpoint prefix (`<run>/step-00000040` -> `<run>`)."""
    return prefix.rstrip("/").rsplit("/", 1)[0] if "/" in prefix.rstrip("/") else ""


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
    """The newest committed checkpoint whose files are all present: of one run, its highest step (a
    run's steps only move forward, whatever the clock of the host that committed each one said); of
    any run, the latest commit."""
    committed = list_committed(storage, run_id)
    if run_id:
        committed.sort(key=lambda c: c.step)
    for checkpoint in reversed(committed):
        if not missing_or_resized(storage, checkpoint):
            return checkpoint
    return None


def retained_steps(
    steps: list[int], keep_last: int, keep_every_steps: int = 0, protect: set[int] = frozenset()
) -> set[int]:
    """Which of `steps` a retention policy keeps: the newest `keep_last`, every multiple of
    `keep_every_steps` (0: none), and the `protect`ed ones (the newest verified checkpoint)."""
    if keep_last < 2:
        raise ValueError("keep_last must be at least 2: the newest checkpoint may still be in use")
    if keep_every_steps < 0:
        raise ValueError("keep_every_steps must be 0 (off) or positive")
    ordered = sorted(set(steps))
    kept = set(ordered[-keep_last:])
    if keep_every_steps:
        kept |= {s for s in ordered if s % keep_every_steps == 0}
    return kept | (set(ordered) & set(protect))


def apply_retention(
    storage: Storage, run_id: str, keep_last: int, keep_every_steps: int = 0, up_to_step: int | None = None
) -> list[int]:
    """Delete the committed checkpoints of a run the policy does not keep; returns the deleted steps.

    Only checkpoints at steps up to `up_to_step` (None: all) are weighed: the snapshot task passes
    the step it has just verified, so a checkpoint committed since, which it has not yet verified
    and recorded, is never deleted under it. The newest verified checkpoint is always kept, even
    when newer ones are damaged. The manifest goes first so a half-deleted checkpoint is never
    mistaken for a committed one.
    """
    retained_steps([], keep_last, keep_every_steps)  # refuse a bad policy before touching anything
    committed = sorted(list_committed(storage, run_id), key=lambda c: c.step)
    if up_to_step is not None:
        committed = [c for c in committed if c.step <= up_to_step]
    if len(committed) <= keep_last:
        return []
    newest_verified = next((c.step for c in reversed(committed) if not missing_or_resized(storage, c)), None)
    protect = {newest_verified} if newest_verified is not None else set()
    kept = retained_steps([c.step for c in committed], keep_last, keep_every_steps, protect)
    doomed = [c for c in committed if c.step not in kept]
    for checkpoint in doomed:
        storage.delete([f"{checkpoint.prefix}/{MANIFEST_NAME}"])
        storage.delete([f"{checkpoint.prefix}/{entry.name}" for entry in checkpoint.manifest.files])
    return [c.step for c in doomed]


def abort_stale_uploads(storage: Storage, run_id: str, up_to_step: int) -> list[str]:
    """Abort the run's unfinished uploads at steps up to `up_to_step`: once a step is committed,
    nothing at or before it is still being written (saves run one after another), so what is
    left there was interrupted. Returns the keys aborted."""
    stale = [item for item in storage.list_incomplete(run_id) if (step_of(item.key) or 0) <= up_to_step]
    storage.abort_incomplete(stale)
    return [item.key for item in stale]
