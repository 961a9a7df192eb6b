"""The node-local tier: checkpoints on each node's scratch disk, written first and read first.

Layout: `<node scratch>/checkpoints/<run id>/step-<8 digits>-<save id>/`. A node holds the files its
own ranks wrote and `manifest.json` — the same file list the durable copy gets, written by the
node's first rank once every rank of the job has reported its files. Each save has its own
folder (the save id names the attempt and the save), so no save ever writes where another
attempt's files are, and deleting one never races a writer.

A restore reads every node's inventory (what it holds, its manifest) and gathers from the other
nodes whatever its own node lacks; see trainflow.runtime.checkpointing.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from trainflow.checkpoint.catalog import step_of
from trainflow.checkpoint.manifest import MANIFEST_NAME, Manifest, ManifestError
from trainflow.checkpoint.storage import PARTIAL, AlreadyExists, LocalStorage

LOCAL_KEEP = 2  # committed local checkpoints kept per node: the newest, and the one before it


@dataclass(frozen=True)
class Held:
    """What one node holds of one local checkpoint folder."""

    prefix: str
    manifest_text: str | None  # None: the node never committed this folder
    present: dict[str, int] = field(default_factory=dict)  # file name -> size

    @property
    def step(self) -> int:
        return step_of(self.prefix) or 0

    def manifest(self) -> Manifest | None:
        if self.manifest_text is None:
            return None
        try:
            return Manifest.from_json(self.manifest_text)
        except ManifestError:
            return None


class LocalTier:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.storage = LocalStorage(self.root)

    def prefix(self, run_id: str, step: int, save_id: str) -> str:
        return f"{run_id}/step-{step:08d}-{save_id}"

    def folder(self, prefix: str) -> Path:
        return self.root / prefix

    def commit(self, prefix: str, manifest: Manifest) -> None:
        """Write the node's manifest last: from now on the folder is a local checkpoint."""
        try:
            self.storage.put_if_absent(f"{prefix}/{MANIFEST_NAME}", manifest.to_json().encode())
        except AlreadyExists:
            if self.storage.read(f"{prefix}/{MANIFEST_NAME}") != manifest.to_json().encode():
                raise

    def inventory(self, run_id: str) -> list[Held]:
        """Every folder of the run on this node, committed or not, with the files it holds."""
        run = self.root / run_id
        if not run.is_dir():
            return []
        held = []
        for folder in sorted(p for p in run.iterdir() if p.is_dir() and step_of(p.name + "/") is not None):
            manifest_path = folder / MANIFEST_NAME
            try:
                text = manifest_path.read_text() if manifest_path.is_file() else None
            except (OSError, UnicodeDecodeError):
                text = None
            present = {
                p.name: p.stat().st_size
                for p in folder.iterdir()
                if p.is_file() and p.name != MANIFEST_NAME and PARTIAL not in p.name
            }
            held.append(Held(f"{run_id}/{folder.name}", text, present))
        return held

    def committed(self, run_id: str) -> list[Held]:
        """This node's committed folders of the run, oldest first."""
        found = [h for h in self.inventory(run_id) if h.manifest() is not None]
        return sorted(found, key=lambda h: (h.step, h.manifest().committed_at))

    def discard(self, prefix: str) -> None:
        """Remove a folder, manifest first, so a half-removed folder never reads as committed."""
        folder = self.folder(prefix)
        (folder / MANIFEST_NAME).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)

    def prune(self, run_id: str, keep: int, protect: set[str] = frozenset()) -> list[str]:
        """Keep the newest `keep` committed folders of the run and the `protect`ed ones; drop the rest,
        including folders of saves that never committed. Returns the prefixes removed."""
        committed = [h.prefix for h in self.committed(run_id)]
        kept = set(committed[-keep:]) | set(protect)
        doomed = [h.prefix for h in self.inventory(run_id) if h.prefix not in kept]
        for prefix in doomed:
            self.discard(prefix)
        return doomed
