"""Saving (every rank, same steps), asynchronous and in two tiers:
1. the training thread waits for the previous save, stages the state — tensors copied to host
   memory, everything else serialised as JSON — and goes back to training;
2. a background thread writes the tensors with DCP into the node-local tier, hashes this rank's
   files and gathers every rank's file list over the checkpointer's own gloo group;
3. each rank copies its files to a rank of the next node (checkpoint/buddy.py), and each node's
   first rank commits the node's copy with a local manifest;
4. when a snapshot is due (the first save of an attempt, then every `snapshot_every_s`, steps
   kept forever, the last step, an emergency checkpoint) the copy is published (publish.py).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import asdict, dataclass

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainflow.checkpoint.buddy import copy_to_buddies
from trainflow.checkpoint.dcp_io import local_writer, make_stager, own_files
from trainflow.checkpoint.local_tier import LOCAL_KEEP
from trainflow.checkpoint.manifest import FileEntry, Manifest, describe_file
from trainflow.checkpoint.policy import SnapshotPolicy
from trainflow.checkpoint.storage import StorageError
from trainflow.runtime.checkpoint_context import CheckpointContext, describe, warn
from trainflow.runtime.publish import Publisher, Saved
from trainflow.runtime.state_io import SHARED_STATE, Stateful, capture, rank_file

BACKGROUND_NICENESS = 19  # how far below training the background save runs (see _yield_to_training)
STORAGE_WAIT_REPORT_S = 1.0  # training waiting this long for a save is reported as blocked in a storage call


@dataclass(frozen=True)
class SaveOutcome:
    step: int
    stall_s: float  # how long the caller waited: the previous save, staging, and with commit the rest
    stage_s: float
    committed: bool | None = None  # for a waited-for save: committed to the checkpoint URI


@dataclass
class _Job:
    step: int
    save_id: str
    tensors: dict[str, torch.Tensor]  # staged copies
    shared: str  # JSON: the non-tensor state and the tensors' places in it
    personal: str  # JSON: this rank's RNG states and extras
    commit: bool
    stage_s: float
    began: float  # perf_counter when the caller asked for the save
    stall_s: float  # what an asynchronous save cost the caller: the wait for the previous one, staging


def _yield_to_training(niceness: int) -> None:
    """Run the background save at a lower CPU priority than training. On Linux niceness is per
    thread and inherited by the threads this one starts (uploads, hashing), so where cores are
    short the scheduler gives training the CPU and the save the rest."""
    try:
        if niceness:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: the save just runs at training's priority


class Saver:
    def __init__(self, ctx: CheckpointContext, niceness: int = BACKGROUND_NICENESS, series: str = ""):
        self.ctx = ctx
        self._series = series
        self.policy = SnapshotPolicy(ctx.config.snapshot_every_s, ctx.config.keep_every_steps, ctx.config.local_tier)
        self.publisher = Publisher(ctx, self.policy)
        self._stager = make_stager()
        # not a daemon: a process that exits normally finishes the save in flight first
        self._worker = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="trainflow-checkpoint",
            initializer=_yield_to_training,
            initargs=(niceness,),
        )
        self._pending: Future | None = None
        self._pending_step = 0
        self._last: Saved | None = None
        self._saves = 0
        self._metrics: dict[str, float] = {}
        self._metrics_lock = threading.Lock()

    def save(self, step: int, state: Stateful, commit: bool = False) -> SaveOutcome:
        """Collective: every rank calls it for the same steps. Returns once the state is staged, or
        with `commit` once the checkpoint is committed to the checkpoint URI (StorageError if it
        could not be). Called again for the step just saved (an emergency checkpoint right after a
        scheduled one) it saves nothing new and returns once that save is committed."""
        began = time.perf_counter()
        last = self._wait()
        if last is not None and last.step == step and last.manifest is not None:
            if not last.committed:
                self._pending = self._worker.submit(self._snapshot_again, last, began)
                self._pending_step = step
                last = self._wait()
                self._require_committed(last)
            return SaveOutcome(step, time.perf_counter() - began, 0.0, last.committed)

        staging = time.perf_counter()
        tensors, shared, personal = capture(step, state)
        staged = self._stager.stage(tensors)
        stage_s = time.perf_counter() - staging
        self._saves += 1
        stall_s = time.perf_counter() - began
        save_id = f"a{self.ctx.config.attempt}-{self._series}{self._saves}"
        job = _Job(step, save_id, staged, shared, personal, commit, stage_s, began, stall_s)
        self._pending, self._pending_step = self._worker.submit(self._save_in_background, job), step
        if commit:
            self._require_committed(self._wait())
        stall = time.perf_counter() - began
        self._note(checkpoint_stall_s=stall, checkpoint_stage_s=stage_s)
        return SaveOutcome(step, stall, stage_s, True if commit else None)

    def wait(self) -> bool | None:
        """Wait for the save in flight; whether the last save is committed to the checkpoint URI."""
        last = self._wait()
        return None if last is None else last.committed

    def close(self) -> None:
        """Wait for the save in flight, then stop the background thread."""
        self._wait()
        self._worker.shutdown(wait=True)
        self._stager.close()
        self.publisher.close()

    def abandon(self, within_s: float) -> bool:
        """The run ends in a failure its process goes on from (runtime/in_place.py): waits
        `within_s` at most for the save in flight to end (it runs on, with every rank's background
        thread); False when it did not (its collective still waits: the process cannot go on
        cleanly). The uploads' helper is closed once it has ended."""
        pending, self._pending = self._pending, None
        self._worker.shutdown(wait=False, cancel_futures=True)
        if pending is not None:
            wait_for_futures([pending], timeout=within_s)
        if pending is None or pending.done():
            self.publisher.close()
            return True
        pending.add_done_callback(lambda _: self.publisher.close())
        return False

    def take_metrics(self) -> dict[str, float]:
        """Figures of the saves since the last call (rank 0 reports them with the next step)."""
        with self._metrics_lock:
            taken, self._metrics = self._metrics, {}
        return taken

    def _note(self, **figures: float) -> None:
        with self._metrics_lock:
            self._metrics.update(figures)

    def _wait(self) -> Saved | None:
        if self._pending is not None:
            future, self._pending = self._pending, None
            try:
                done, _ = wait_for_futures([future], timeout=STORAGE_WAIT_REPORT_S)
                if not done:
                    with self.ctx.storage_call(f"waiting for the checkpoint save of step {self._pending_step}"):
                        wait_for_futures([future])
                self._last = future.result()
            except (Exception, CheckpointException) as exc:  # a collective under the save failed: a peer is gone
                warn(f"checkpoint save failed: {describe(exc)}")
                self._last = None
        return self._last

    def _require_committed(self, saved: Saved | None) -> None:
        if saved is None or not saved.committed:
            reason = saved.reason if saved is not None else "the save did not finish"
            raise StorageError(f"checkpoint could not be committed to {self.ctx.storage.uri}: {reason}")

    def _save_in_background(self, job: _Job) -> Saved:
        prefix = self.ctx.tier.prefix(self.ctx.config.run_id, job.step, job.save_id)
        folder = self.ctx.tier.folder(prefix)
        error, own, write_s, hash_s = None, [], 0.0, 0.0
        if self.ctx.rank == 0 and not job.commit:
            self.publisher.add_stall(job.stall_s)  # a waited-for save reports its whole wait instead
        began = time.perf_counter()
        try:
            dcp.save(job.tensors, storage_writer=local_writer(folder), process_group=self.ctx.group)
            names = own_files(folder, self.ctx.rank) + [rank_file(self.ctx.rank)]
            (folder / rank_file(self.ctx.rank)).write_text(job.personal)
            if self.ctx.rank == 0:
                (folder / SHARED_STATE).write_text(job.shared)
                names.append(SHARED_STATE)
            written = time.perf_counter()
            own = [describe_file(folder / name) for name in names]
            write_s, hash_s = written - began, time.perf_counter() - written
        except (Exception, CheckpointException) as exc:  # reported below, after every rank had its say
            error = describe(exc)
        wish = self.policy.wants_snapshot(job.step, job.commit) if self.ctx.rank == 0 else job.commit
        everyone = self.ctx.all_gather(
            {
                "rank": self.ctx.rank,
                "node": self.ctx.config.node,
                "error": error,
                "own": [asdict(e) for e in own],
                "wish": wish,
                "now": time.time(),
                "write_s": write_s,
                "hash_s": hash_s,
            }
        )
        failed = [f"rank {g['rank']}: {g['error']}" for g in everyone if g["error"]]
        if failed:
            if self.ctx.leader:
                self.ctx.tier.discard(prefix)
            if self.ctx.rank == 0:
                self.publisher.report_failed(
                    job.step,
                    prefix,
                    "local save failed: " + "; ".join(failed),
                    0,
                    self.publisher.take_stall(job.began if job.commit else None),
                )
            return Saved(job.step, prefix, None, reason="; ".join(failed))

        files = tuple(sorted((FileEntry(**e) for g in everyone for e in g["own"]), key=lambda e: e.name))
        manifest = Manifest(
            step=job.step,
            world_size=self.ctx.world_size,
            spec_hash=self.ctx.config.spec_hash,
            code_version=self.ctx.config.code_version,
            run_id=self.ctx.config.run_id,
            files=files,
            committed_at=everyone[0]["now"],
        )
        if self.ctx.config.buddy_copies:
            self._copy_to_buddies(prefix, folder, everyone)
        if self.ctx.leader:
            try:
                self.ctx.tier.commit(prefix, manifest)
            except (OSError, StorageError) as exc:
                warn(f"local checkpoint {prefix} not committed: {describe(exc)}")
        saved = Saved(job.step, prefix, manifest, tuple(own))
        timings = {
            "stage_s": job.stage_s,
            "save_s": max(g["write_s"] for g in everyone),
            "hash_s": max(g["hash_s"] for g in everyone),
        }
        if any(g["wish"] for g in everyone):
            saved = self.publisher.publish(saved, timings, job.began if job.commit else None)
        elif self.ctx.rank == 0:
            self._note(
                checkpoint_local_bytes=manifest.total_bytes,
                checkpoint_local_write_s=timings["save_s"],
                checkpoint_local_MBps=manifest.total_bytes / 1e6 / max(timings["save_s"], 1e-9),
            )
        if self.ctx.leader:
            try:
                keep = LOCAL_KEEP if self.ctx.config.local_tier else 1
                self.ctx.tier.prune(self.ctx.config.run_id, keep, protect={prefix})
            except OSError as exc:
                warn(f"local checkpoint retention: {describe(exc)}")
        return saved

    def _copy_to_buddies(self, prefix: str, folder, everyone: list[dict]) -> None:
        """Each rank's files also on the next node (checkpoint/buddy.py), before the node commits."""
        began = time.perf_counter()
        try:
            received = copy_to_buddies(
                self.ctx.group,
                self.ctx.rank,
                {g["rank"]: g["node"] for g in everyone},
                {g["rank"]: [FileEntry(**e) for e in g["own"]] for g in everyone},
                folder,
            )
        except (RuntimeError, OSError) as exc:  # a peer gone mid-copy: this attempt is ending anyway
            warn(f"local checkpoint {prefix}: no buddy copy: {describe(exc)}")
            return
        if self.ctx.rank == 0:
            self._note(checkpoint_buddy_copy_s=time.perf_counter() - began, checkpoint_buddy_bytes=received)

    def _snapshot_again(self, saved: Saved, began: float) -> Saved:
        return self.publisher.publish(saved, {"stage_s": 0.0, "save_s": 0.0, "hash_s": 0.0}, began)
