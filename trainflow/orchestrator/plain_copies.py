"""The orchestrator's side of a plain script's own checkpoints: node 0 commits each copy of the
script's folder to the store (trainflow/backends/plain_node.py); the orchestrator finds the new
commits by listing the run's folder there and passes each on as a commit, which the snapshot task
verifies, records and applies retention to, as it does for trainflow's own checkpoints."""

from __future__ import annotations

import threading
from collections.abc import Callable

from trainflow.checkpoint.catalog import read_manifest
from trainflow.checkpoint.manifest import MANIFEST_NAME, ManifestError
from trainflow.checkpoint.storage import Storage, StorageError

POLL_S = 1.0


class CopyFeed:
    """New committed copies of one attempt, as commit events, until stopped (then once more)."""

    def __init__(self, storage: Storage, run_id: str, attempt: int, publish: Callable[[dict], None]):
        self.storage, self.run_id, self.attempt, self.publish = storage, run_id, attempt, publish
        self._seen = set(self._manifests())  # the copies of earlier attempts were passed on then
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainflow-copy-feed", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # the last copy, taken once every rank had exited 0

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def _manifests(self) -> list[str]:
        try:
            return sorted(k for k in self.storage.list(self.run_id) if k.endswith(f"/{MANIFEST_NAME}"))
        except StorageError:
            return []  # unreachable for now: the next poll finds them

    def poll(self) -> None:
        for key in self._manifests():
            if key in self._seen:
                continue
            self._seen.add(key)
            prefix = key.removesuffix(f"/{MANIFEST_NAME}")
            try:
                manifest = read_manifest(self.storage, prefix)
            except ManifestError:
                continue  # not a copy the catalog would ever load
            self.publish(
                {
                    "kind": "checkpoint",
                    "status": "committed",
                    "step": manifest.step,
                    "prefix": prefix,
                    "t": manifest.committed_at,
                    "bytes": manifest.total_bytes,
                    "attempt": self.attempt,
                }
            )
