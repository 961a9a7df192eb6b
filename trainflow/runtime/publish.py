"""Publishing a node-local checkpoint (every rank, when a snapshot is due): every rank uploads
its own files from its node, and once every upload succeeded rank 0 commits the manifest to the
checkpoint URI with a create-only write and reports the commit. The orchestrator's snapshot task
verifies it, records it and applies retention. Any failure leaves no manifest and is reported,
and the files uploaded for it are removed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from trainflow.checkpoint.catalog import checkpoint_prefix
from trainflow.checkpoint.location import is_remote
from trainflow.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest
from trainflow.checkpoint.policy import SnapshotPolicy
from trainflow.checkpoint.storage import StorageError
from trainflow.checkpoint.transfer_agent import TransferAgent
from trainflow.contracts.status_protocol import Checkpoint
from trainflow.runtime.checkpoint_context import CheckpointContext, warn


@dataclass(frozen=True)
class Saved:
    """What one finished background save left behind, as this rank knows it."""

    step: int
    local_prefix: str
    manifest: Manifest | None  # None: the save failed before any commit
    own: tuple[FileEntry, ...] = ()
    committed: bool = False  # committed to the checkpoint URI
    reason: str = ""


class Publisher:
    def __init__(self, ctx: CheckpointContext, policy: SnapshotPolicy):
        self.ctx = ctx
        self.policy = policy
        self._unfinished: set[str] = set()  # durable keys this rank failed to upload: aborted later
        self._stall_backlog = 0.0  # rank 0: training time spent on saves not yet reported in an event
        # uploads to a remote store run in a helper process: its threads never take the GIL from training
        storage = ctx.storage
        self._uploader = TransferAgent(storage.uri) if is_remote(storage.uri) else storage

    def close(self) -> None:
        if isinstance(self._uploader, TransferAgent):
            self._uploader.close()

    def add_stall(self, seconds: float) -> None:
        """Rank 0: training time an asynchronous save cost, for the next event to carry."""
        self._stall_backlog += seconds

    def take_stall(self, waited_since: float | None = None) -> float:
        """Rank 0: training time the saves cost since the last event, and with `waited_since` the
        wait of a caller for this commit."""
        stall, self._stall_backlog = self._stall_backlog, 0.0
        return stall + (time.perf_counter() - waited_since if waited_since is not None else 0.0)

    def publish(self, saved: Saved, timings: dict[str, float], waited_since: float | None) -> Saved:
        """Collective: upload every rank's files of a local checkpoint, then rank 0 commits.
        `waited_since`: when the caller that waits for this commit started waiting."""
        if self.ctx.rank == 0:
            self.policy.started()
        prefix = checkpoint_prefix(self.ctx.config.run_id, saved.step)
        manifest = saved.manifest
        blocked = None
        if self.ctx.rank == 0:
            try:
                if self.ctx.storage.size(f"{prefix}/{MANIFEST_NAME}") is not None:
                    blocked = "exists"  # an earlier attempt committed this step: never overwrite its files
            except StorageError as exc:
                blocked = str(exc)
        blocked = self.ctx.broadcast(blocked)
        if blocked == "exists":
            return replace(saved, committed=True, reason="committed earlier")
        if blocked:
            if self.ctx.rank == 0:
                self.report_failed(
                    saved.step,
                    prefix,
                    f"checkpoint store unavailable: {blocked}",
                    manifest.total_bytes,
                    self.take_stall(waited_since=waited_since),
                )
            return replace(saved, committed=False, reason=blocked)

        self._abort_unfinished()
        folder = self.ctx.tier.folder(saved.local_prefix)
        keys = [(folder / e.name, f"{prefix}/{e.name}") for e in saved.own]
        began, error = time.perf_counter(), None
        try:
            self._uploader.upload_many(keys)
        except StorageError as exc:
            error = str(exc)
            self._unfinished.update(key for _, key in keys)
        everyone = self.ctx.all_gather({"rank": self.ctx.rank, "error": error, "upload_s": time.perf_counter() - began})
        outcome = None
        if self.ctx.rank == 0:
            errors = [f"rank {g['rank']}: {g['error']}" for g in everyone if g["error"]]
            timings = {**timings, "upload_s": max(g["upload_s"] for g in everyone)}
            outcome = self._commit(prefix, manifest, errors, timings, waited_since)
        committed, reason = self.ctx.broadcast(outcome)
        return replace(saved, committed=committed, reason=reason)

    def _commit(
        self, prefix: str, manifest: Manifest, errors: list[str], timings: dict[str, float], waited_since: float | None
    ) -> tuple[bool, str]:
        """Rank 0: write the manifest last, with a create-only write, and report the outcome."""
        if errors:
            reason = "upload failed: " + "; ".join(errors)
        else:
            began = time.perf_counter()
            try:
                durable = replace(manifest, committed_at=time.time())
                self.ctx.storage.put_if_absent(f"{prefix}/{MANIFEST_NAME}", durable.to_json().encode())
            except StorageError as exc:
                reason = f"commit failed: {exc}"
            else:
                self.ctx.send(
                    Checkpoint(
                        step=manifest.step,
                        prefix=prefix,
                        status="committed",
                        bytes=manifest.total_bytes,
                        files=len(manifest.files),
                        world_size=manifest.world_size,
                        commit_s=time.perf_counter() - began,
                        stall_s=self.take_stall(waited_since=waited_since),
                        **timings,
                    )
                )
                return True, ""
        stall_s = self.take_stall(waited_since=waited_since)
        self.report_failed(manifest.step, prefix, reason, manifest.total_bytes, stall_s)
        self._remove_uncommitted(prefix, manifest)
        return False, reason

    def _remove_uncommitted(self, prefix: str, manifest: Manifest) -> None:
        """Rank 0, after a failed snapshot: remove the files every rank uploaded for it (a store that
        filled up would otherwise keep them for good), unless the step is committed after all."""
        try:
            if self.ctx.storage.size(f"{prefix}/{MANIFEST_NAME}") is None:
                self.ctx.storage.delete([f"{prefix}/{e.name}" for e in manifest.files])
        except StorageError as exc:
            warn(f"files of the failed snapshot {prefix} not removed: {exc}")

    def report_failed(self, step: int, prefix: str, reason: str, size: int, stall_s: float) -> None:
        warn(f"checkpoint at step {step} not committed: {reason}")
        self.ctx.send(
            Checkpoint(step=step, prefix=prefix, status="failed", reason=reason[:2000], bytes=size, stall_s=stall_s)
        )

    def _abort_unfinished(self) -> None:
        """Abort what this rank's earlier failed uploads left in the store, now that it answers."""
        if not self._unfinished:
            return
        try:
            stale = [i for i in self.ctx.storage.list_incomplete(self.ctx.config.run_id) if i.key in self._unfinished]
            self.ctx.storage.abort_incomplete(stale)
            self._unfinished.clear()
        except StorageError:
            pass  # still unreachable: try again at the next snapshot
