"""Save and restore the training state: asynchronous, two tiers, verified, committed by a manifest.

Saving (`save`, every rank, same steps):
  1. the training thread waits for the previous save, stages the state — tensors copied to host
     memory, everything else serialised as JSON — and goes back to training;
  2. a background thread writes the tensors with DCP into the node-local tier, hashes this rank's
     files and gathers every rank's file list over a gloo group of its own (never the training's);
  3. each node's first rank commits the node's copy with a local manifest;
  4. when a snapshot is due (the first save of an attempt, then every `snapshot_every_s`, steps
     kept forever, the last step, an emergency checkpoint) every rank uploads its own files from
     its node, and once every upload succeeded rank 0 commits the manifest to the checkpoint URI
     with a create-only write and reports the commit; the orchestrator's snapshot task verifies
     it, records it and applies retention. Any failure leaves no manifest and is reported.

Restoring (`restore`, every rank): candidates newest first — a local copy before the durable one
of the same step, then older ones. Every file is checked against the manifest (size, sha256)
before DCP reads anything; a candidate that fails is skipped with a reason. A local copy is
spread over the nodes that wrote it: each node first gets what it lacks from the others. DCP
reshards, so a checkpoint written at one world size loads at another.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainflow.checkpoint.catalog import (
    Committed,
    checkpoint_prefix,
    list_committed,
    missing_or_resized,
    read_manifest,
    run_of,
    step_of,
)
from trainflow.checkpoint.dcp_io import SafeFileSystemReader, local_writer, make_stager, own_files
from trainflow.checkpoint.exchange import broadcast_file
from trainflow.checkpoint.local_tier import LOCAL_KEEP, Held, LocalTier
from trainflow.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, ManifestError, describe_file, verify_files
from trainflow.checkpoint.policy import SnapshotPolicy
from trainflow.checkpoint.storage import Storage, StorageError
from trainflow.checkpoint.transfer_agent import TransferAgent
from trainflow.runtime.restore_checks import metadata_problems, read_personal, read_shared, tensor_refs
from trainflow.runtime.state import capture_rng, join_tensors, restore_rng, split_tensors
from trainflow.worker_config import WorkerConfig

SHARED_STATE = "state.json"
BACKGROUND_NICENESS = 19  # how far below training the background save runs (see _yield_to_training)
STORAGE_WAIT_REPORT_S = 1.0  # training waiting this long for a save is reported as blocked in a storage call


class CheckpointInvalid(RuntimeError):
    """No checkpoint the orchestrator pointed at, nor an older one, matched its manifest."""


class _Rejected(Exception):
    """One restore candidate failed; every rank raises it at the same point (decided on gathered data)."""


@dataclass(frozen=True)
class Stateful:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    extras: dict[str, Any]


@dataclass(frozen=True)
class SaveOutcome:
    step: int
    stall_s: float  # how long the caller waited: the previous save, staging, and with commit the rest
    stage_s: float
    committed: bool | None = None  # for a waited-for save: committed to the checkpoint URI


@dataclass(frozen=True)
class Restored:
    step: int
    prefix: str
    tier: str  # "local" or "durable"
    bytes: int
    seconds: float = 0.0
    transfer_s: float = 0.0  # download (durable) or exchange between nodes (local)
    verify_s: float = 0.0
    load_s: float = 0.0
    fallbacks: tuple[str, ...] = ()


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


@dataclass(frozen=True)
class _Saved:
    """What one finished background save left behind, as this rank knows it."""

    step: int
    local_prefix: str
    manifest: Manifest | None  # None: the save failed before any commit
    own: tuple[FileEntry, ...] = ()
    committed: bool = False  # committed to the checkpoint URI
    reason: str = ""


@dataclass(frozen=True)
class _Candidate:
    prefix: str
    step: int
    tier: str
    order: float = 0.0  # among local copies of one step, the later save first
    holders: dict[int, Held] = field(default_factory=dict)  # local: leader rank -> what its node holds


def rank_file(rank: int) -> str:
    return f"rank-{rank}.json"


def _ignore(kind: str, **fields: Any) -> None:
    pass


def _yield_to_training(niceness: int) -> None:
    """Run the background save at a lower CPU priority than training. On Linux niceness is per
    thread and inherited by the threads this one starts (uploads, hashing), so where cores are
    short the scheduler gives training the CPU and the save the rest."""
    try:
        if niceness:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: the save just runs at training's priority


def _warn(message: str) -> None:
    print(f"trainflow: {message}", file=sys.stderr, flush=True)  # the node's log


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]


class Checkpointer:
    def __init__(
        self,
        config: WorkerConfig,
        storage: Storage,
        rank: int,
        world_size: int,
        local_rank: int = 0,
        send: Callable[..., None] | None = None,
        niceness: int = BACKGROUND_NICENESS,
    ):
        self.config = config
        self.storage = storage
        self.rank = rank
        self.world_size = world_size
        self.leader = local_rank == 0  # the node's first rank reads and writes the node's tier
        self.send = send or _ignore  # events to the orchestrator (rank 0 sends them)
        self.scratch = Path(config.node_scratch)
        self.tier = LocalTier(self.scratch / "checkpoints")
        self.policy = SnapshotPolicy(config.snapshot_every_s, config.keep_every_steps, config.local_tier)
        # background saves run collectives; a group of their own keeps them apart from training's
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=config.collective_timeout_s))
        self._stager = make_stager()
        # not a daemon: a process that exits normally finishes the save in flight first
        self._worker = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="trainflow-checkpoint",
            initializer=_yield_to_training, initargs=(niceness,),
        )
        self._pending: Future | None = None
        self._pending_step = 0
        self._last: _Saved | None = None
        self._saves = 0
        self._metrics: dict[str, float] = {}
        self._metrics_lock = threading.Lock()
        self._unfinished: set[str] = set()  # durable keys this rank failed to upload: aborted later
        self._stall_backlog = 0.0  # rank 0: training time spent on saves not yet reported in an event
        # uploads to S3 run in a helper process: its threads never take the GIL from training
        self._uploader = TransferAgent(storage.uri) if storage.uri.startswith("s3://") else storage

    # ---- saving -------------------------------------------------------------------------------

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
        tensors, shared, personal = self._capture(step, state)
        staged = self._stager.stage(tensors)
        stage_s = time.perf_counter() - staging
        self._saves += 1
        stall_s = time.perf_counter() - began
        save_id = f"a{self.config.attempt}-{self._saves}"
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
        if isinstance(self._uploader, TransferAgent):
            self._uploader.close()

    def take_metrics(self) -> dict[str, float]:
        """Figures of the saves since the last call (rank 0 reports them with the next step)."""
        with self._metrics_lock:
            taken, self._metrics = self._metrics, {}
        return taken

    def _note(self, **figures: float) -> None:
        with self._metrics_lock:
            self._metrics.update(figures)

    @contextmanager
    def _storage_call(self, call: str) -> Iterator[None]:
        """Tell the orchestrator training is blocked on the checkpoint store, and when it is not any
        more: a stall in a storage call is a storage outage, not a hang of the training."""
        since = time.time()
        self.send("storage", state="waiting", since=since, call=call)
        try:
            yield
        finally:
            self.send("storage", state="done", since=since, call=call)

    def _wait(self) -> _Saved | None:
        if self._pending is not None:
            future, self._pending = self._pending, None
            try:
                done, _ = wait_for_futures([future], timeout=STORAGE_WAIT_REPORT_S)
                if not done:
                    with self._storage_call(f"waiting for the checkpoint save of step {self._pending_step}"):
                        wait_for_futures([future])
                self._last = future.result()
            except (Exception, CheckpointException) as exc:  # a collective under the save failed: a peer is gone
                _warn(f"checkpoint save failed: {_describe(exc)}")
                self._last = None
        return self._last

    def _require_committed(self, saved: _Saved | None) -> None:
        if saved is None or not saved.committed:
            reason = saved.reason if saved is not None else "the save did not finish"
            raise StorageError(f"checkpoint could not be committed to {self.storage.uri}: {reason}")

    def _capture(self, step: int, state: Stateful) -> tuple[dict[str, torch.Tensor], str, str]:
        model_sd, optim_sd = self._state_dicts(state)
        tensors, shared = split_tensors({"model": model_sd, "optim": optim_sd})
        personal = {
            "step": step,
            "rng": capture_rng(),
            "extras": {name: obj.state_dict() for name, obj in state.extras.items()},
        }
        # serialised now: the live objects change as soon as training goes on
        return tensors, json.dumps(shared), json.dumps(personal)

    def _save_in_background(self, job: _Job) -> _Saved:
        prefix = self.tier.prefix(self.config.run_id, job.step, job.save_id)
        folder = self.tier.folder(prefix)
        error, own, write_s, hash_s = None, [], 0.0, 0.0
        if self.rank == 0 and not job.commit:
            self._stall_backlog += job.stall_s  # a waited-for save reports its whole wait instead
        began = time.perf_counter()
        try:
            dcp.save(job.tensors, storage_writer=local_writer(folder), process_group=self.group)
            names = own_files(folder, self.rank) + [rank_file(self.rank)]
            (folder / rank_file(self.rank)).write_text(job.personal)
            if self.rank == 0:
                (folder / SHARED_STATE).write_text(job.shared)
                names.append(SHARED_STATE)
            written = time.perf_counter()
            own = [describe_file(folder / name) for name in names]
            write_s, hash_s = written - began, time.perf_counter() - written
        except (Exception, CheckpointException) as exc:  # reported below, after every rank had its say
            error = _describe(exc)
        wish = self.policy.wants_snapshot(job.step, job.commit) if self.rank == 0 else job.commit
        everyone = self._all_gather(
            {"rank": self.rank, "error": error, "own": [asdict(e) for e in own], "wish": wish,
             "now": time.time(), "write_s": write_s, "hash_s": hash_s}
        )
        failed = [f"rank {g['rank']}: {g['error']}" for g in everyone if g["error"]]
        if failed:
            if self.leader:
                self.tier.discard(prefix)
            if self.rank == 0:
                self._report_failed(job.step, prefix, "local save failed: " + "; ".join(failed), 0, self._stall(job))
            return _Saved(job.step, prefix, None, reason="; ".join(failed))

        files = tuple(sorted((FileEntry(**e) for g in everyone for e in g["own"]), key=lambda e: e.name))
        manifest = Manifest(
            step=job.step,
            world_size=self.world_size,
            spec_hash=self.config.spec_hash,
            code_version=self.config.code_version,
            run_id=self.config.run_id,
            files=files,
            committed_at=everyone[0]["now"],
        )
        if self.leader:
            try:
                self.tier.commit(prefix, manifest)
            except (OSError, StorageError) as exc:
                _warn(f"local checkpoint {prefix} not committed: {_describe(exc)}")
        saved = _Saved(job.step, prefix, manifest, tuple(own))
        timings = {
            "stage_s": job.stage_s,
            "save_s": max(g["write_s"] for g in everyone),
            "hash_s": max(g["hash_s"] for g in everyone),
        }
        if any(g["wish"] for g in everyone):
            saved = self._publish(saved, timings, job.began if job.commit else None)
        elif self.rank == 0:
            self._note(
                checkpoint_local_bytes=manifest.total_bytes,
                checkpoint_local_write_s=timings["save_s"],
                checkpoint_local_MBps=manifest.total_bytes / 1e6 / max(timings["save_s"], 1e-9),
            )
        if self.leader:
            try:
                self.tier.prune(self.config.run_id, LOCAL_KEEP if self.config.local_tier else 1, protect={prefix})
            except OSError as exc:
                _warn(f"local checkpoint retention: {_describe(exc)}")
        return saved

    def _snapshot_again(self, saved: _Saved, began: float) -> _Saved:
        return self._publish(saved, {"stage_s": 0.0, "save_s": 0.0, "hash_s": 0.0}, began)

    def _stall(self, job: _Job | None = None, waited_since: float | None = None) -> float:
        """Rank 0: training time the saves cost since the last event, for the next event to carry."""
        stall, self._stall_backlog = self._stall_backlog, 0.0
        if job is not None and job.commit:
            waited_since = job.began
        return stall + (time.perf_counter() - waited_since if waited_since is not None else 0.0)

    def _publish(self, saved: _Saved, timings: dict[str, float], waited_since: float | None) -> _Saved:
        """Collective: upload every rank's files of a local checkpoint, then rank 0 commits.
        `waited_since`: when the caller that waits for this commit started waiting."""
        if self.rank == 0:
            self.policy.started()
        prefix = checkpoint_prefix(self.config.run_id, saved.step)
        manifest = saved.manifest
        blocked = None
        if self.rank == 0:
            try:
                if self.storage.size(f"{prefix}/{MANIFEST_NAME}") is not None:
                    blocked = "exists"  # an earlier attempt committed this step: never overwrite its files
            except StorageError as exc:
                blocked = str(exc)
        blocked = self._broadcast(blocked)
        if blocked == "exists":
            return replace(saved, committed=True, reason="committed earlier")
        if blocked:
            if self.rank == 0:
                self._report_failed(saved.step, prefix, f"checkpoint store unavailable: {blocked}",
                                    manifest.total_bytes, self._stall(waited_since=waited_since))
            return replace(saved, committed=False, reason=blocked)

        self._abort_unfinished()
        folder = self.tier.folder(saved.local_prefix)
        keys = [(folder / e.name, f"{prefix}/{e.name}") for e in saved.own]
        began, error = time.perf_counter(), None
        try:
            self._uploader.upload_many(keys)
        except StorageError as exc:
            error = str(exc)
            self._unfinished.update(key for _, key in keys)
        everyone = self._all_gather({"rank": self.rank, "error": error, "upload_s": time.perf_counter() - began})
        outcome = None
        if self.rank == 0:
            errors = [f"rank {g['rank']}: {g['error']}" for g in everyone if g["error"]]
            timings = {**timings, "upload_s": max(g["upload_s"] for g in everyone)}
            outcome = self._commit(prefix, manifest, errors, timings, waited_since)
        committed, reason = self._broadcast(outcome)
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
                self.storage.put_if_absent(f"{prefix}/{MANIFEST_NAME}", durable.to_json().encode())
            except StorageError as exc:
                reason = f"commit failed: {exc}"
            else:
                self.send(
                    "checkpoint", step=manifest.step, prefix=prefix, status="committed", bytes=manifest.total_bytes,
                    files=len(manifest.files), world_size=manifest.world_size,
                    commit_s=time.perf_counter() - began, stall_s=self._stall(waited_since=waited_since), **timings,
                )
                return True, ""
        self._report_failed(manifest.step, prefix, reason, manifest.total_bytes, self._stall(waited_since=waited_since))
        self._remove_uncommitted(prefix, manifest)
        return False, reason

    def _remove_uncommitted(self, prefix: str, manifest: Manifest) -> None:
        """Rank 0, after a failed snapshot: remove the files every rank uploaded for it (a store that
        filled up would otherwise keep them for good), unless the step is committed after all."""
        try:
            if self.storage.size(f"{prefix}/{MANIFEST_NAME}") is None:
                self.storage.delete([f"{prefix}/{e.name}" for e in manifest.files])
        except StorageError as exc:
            _warn(f"files of the failed snapshot {prefix} not removed: {exc}")

    def _report_failed(self, step: int, prefix: str, reason: str, size: int, stall_s: float) -> None:
        _warn(f"checkpoint at step {step} not committed: {reason}")
        self.send("checkpoint", step=step, prefix=prefix, status="failed", reason=reason[:2000], bytes=size,
                  stall_s=stall_s)

    def _abort_unfinished(self) -> None:
        """Abort what this rank's earlier failed uploads left in the store, now that it answers."""
        if not self._unfinished:
            return
        try:
            stale = [i for i in self.storage.list_incomplete(self.config.run_id) if i.key in self._unfinished]
            self.storage.abort_incomplete(stale)
            self._unfinished.clear()
        except StorageError:
            pass  # still unreachable: try again at the next snapshot

    # ---- restoring ----------------------------------------------------------------------------

    def restore(self, prefix: str | None, state: Stateful) -> Restored | None:
        """Collective. Load the newest checkpoint that verifies: this run's local copies, `prefix`
        (the orchestrator's choice) and the older committed checkpoints of its run. None: start
        fresh. Raises CheckpointInvalid when `prefix` was given and nothing could be loaded."""
        began = time.perf_counter()
        fallbacks: list[str] = []
        for candidate in self._candidates(prefix):
            try:
                if candidate.tier == "local":
                    restored = self._restore_local(candidate, state)
                else:
                    restored = self._restore_durable(candidate, state)
            except _Rejected as exc:
                reason = str(exc)
                fallbacks.append(f"{candidate.tier} step {candidate.step} ({candidate.prefix}): {reason}")
                _warn(f"not restoring the {candidate.tier} checkpoint of step {candidate.step} "
                      f"({candidate.prefix}): {reason}")
                if self.rank == 0 and candidate.tier == "durable":
                    self.send("checkpoint", step=candidate.step, prefix=candidate.prefix, status="rejected",
                              reason=reason[:2000], bytes=0, stall_s=0.0)
                continue
            return replace(restored, seconds=time.perf_counter() - began, fallbacks=tuple(fallbacks))
        if prefix:
            raise CheckpointInvalid(f"no checkpoint could be restored: {'; '.join(fallbacks)}")
        return None

    def _candidates(self, prefix: str | None) -> list[_Candidate]:
        local: list[_Candidate] = []
        if self.config.local_tier:
            mine = self.tier.inventory(self.config.run_id) if self.leader else []
            everyone = self._all_gather({"rank": self.rank, "leader": self.leader, "held": mine})
            by_prefix: dict[str, dict[int, Held]] = {}
            for g in everyone:
                if g["leader"]:
                    for held in g["held"]:
                        by_prefix.setdefault(held.prefix, {})[g["rank"]] = held
            for local_prefix, holders in by_prefix.items():
                manifests = [h.manifest() for h in holders.values() if h.manifest() is not None]
                if manifests:
                    order = max(m.committed_at for m in manifests)
                    local.append(_Candidate(local_prefix, step_of(local_prefix) or 0, "local", order, holders))
        durable: list[_Candidate] = []
        if prefix:
            listed = None
            if self.rank == 0:
                first = step_of(prefix) or 0
                listed = [(prefix, first)]
                try:
                    older = [c for c in list_committed(self.storage, run_of(prefix)) if c.step < first]
                    listed += [(c.prefix, c.step) for c in sorted(older, key=lambda c: c.step, reverse=True)]
                except StorageError:
                    pass  # the store cannot be listed: the orchestrator's choice is still worth a try
            durable = [_Candidate(p, s, "durable") for p, s in self._broadcast(listed)]
        return sorted(local + durable, key=lambda c: (-c.step, c.tier != "local", -c.order))

    def _restore_local(self, candidate: _Candidate, state: Stateful) -> Restored:
        texts = {h.manifest_text for h in candidate.holders.values() if h.manifest_text is not None}
        if len(texts) != 1:
            raise _Rejected("the nodes hold different manifests")
        try:
            manifest = Manifest.from_json(texts.pop())
        except ManifestError as exc:
            raise _Rejected(str(exc)) from None
        folder = self.tier.folder(candidate.prefix)
        sizes = {e.name: e.size for e in manifest.files}

        began = time.perf_counter()
        good: set[str] = set()
        problems: list[str] = []
        if self.leader:
            held = candidate.holders.get(self.rank)
            names = {n for n in (held.present if held else {}) if n in sizes}
            problems = verify_files(manifest, folder, names)
            good = names - {p.split(":", 1)[0] for p in problems}
        everyone = self._all_gather(
            {"rank": self.rank, "leader": self.leader, "good": sorted(good), "problems": problems}
        )
        verify_s = time.perf_counter() - began
        leaders = [g["rank"] for g in everyone if g["leader"]]
        holders = {name: [g["rank"] for g in everyone if name in g["good"]] for name in sizes}
        missing = sorted(name for name, ranks in holders.items() if not ranks)
        if missing:
            seen = [p for g in everyone for p in g["problems"]]
            detail = f" ({'; '.join(seen)})" if seen else ""
            raise _Rejected(f"no node holds an intact copy of {', '.join(missing)}{detail}")

        began = time.perf_counter()
        needs = {r: {name for name in sizes if r not in holders[name]} for r in leaders}
        for name in sorted(sizes):
            receivers = [r for r in leaders if name in needs[r]]
            if receivers:
                broadcast_file(self.group, min(holders[name]), folder / name, sizes[name], self.rank in receivers)
        transfer_s = time.perf_counter() - began
        received = needs.get(self.rank, set())
        problems = verify_files(manifest, folder, received) if received else []
        if self.leader and not problems and not (folder / MANIFEST_NAME).exists():
            self.tier.commit(candidate.prefix, manifest)  # this node now holds the whole checkpoint
        seen = [p for g in self._all_gather(problems) for p in g]
        if seen:
            raise _Rejected(f"copies received from other nodes do not match: {'; '.join(seen)}")
        restored = self._load(folder, manifest, state, candidate.prefix, "local")
        return replace(restored, transfer_s=transfer_s, verify_s=verify_s)

    def _restore_durable(self, candidate: _Candidate, state: Stateful) -> Restored:
        found = None
        if self.rank == 0:  # the manifest, and a cheap look at every file before downloading any
            try:
                manifest = read_manifest(self.storage, candidate.prefix)
                problems = missing_or_resized(self.storage, Committed(candidate.prefix, manifest))
                found = "; ".join(problems) if problems else manifest.to_json()
            except ManifestError as exc:
                found = f"manifest: {exc}"
            except StorageError as exc:
                found = str(exc)
        found = self._broadcast(found)
        if not found.startswith("{"):
            raise _Rejected(found)
        manifest = Manifest.from_json(found)
        folder = self.scratch / "restore" / candidate.prefix.replace("/", "--")
        problems: list[str] = []
        transfer_s = verify_s = 0.0
        if self.leader:
            shutil.rmtree(folder, ignore_errors=True)
            began = time.perf_counter()
            try:
                with self._storage_call(f"downloading the checkpoint {candidate.prefix}"):
                    self.storage.download_many(
                        [(f"{candidate.prefix}/{e.name}", folder / e.name) for e in manifest.files])
            except StorageError as exc:
                problems = [str(exc)]
            transfer_s = time.perf_counter() - began
            if not problems:
                began = time.perf_counter()
                problems = verify_files(manifest, folder)
                verify_s = time.perf_counter() - began
        seen = [p for g in self._all_gather(problems) for p in g]
        try:
            if seen:
                raise _Rejected("; ".join(seen))
            restored = self._load(folder, manifest, state, candidate.prefix, "durable")
            dist.barrier(group=self.group)  # every rank of the node has read the folder
        finally:
            if self.leader:
                shutil.rmtree(folder, ignore_errors=True)
        return replace(restored, transfer_s=transfer_s, verify_s=verify_s)

    def _load(self, folder: Path, manifest: Manifest, state: Stateful, prefix: str, tier: str) -> Restored:
        """Read a verified checkpoint into the live objects. Only JSON and DCP's tensors are read,
        and only from files the manifest lists; a checkpoint whose own files are malformed is
        rejected on every rank alike (the problems are gathered first)."""
        began = time.perf_counter()
        model_sd, optim_sd = self._state_dicts(state)
        template, _ = split_tensors({"model": model_sd, "optim": optim_sd})
        own = folder / rank_file(self.rank)
        listed = {e.name for e in manifest.files}
        shared, problems = read_shared(folder / SHARED_STATE)
        personal, more = read_personal(own if own.name in listed else folder / rank_file(0), manifest.step)
        problems += more + metadata_problems(folder, listed)
        self._reject_if_any(problems)
        refs = tensor_refs(shared)
        unknown = [key for key in refs if key not in template]
        if unknown:
            raise ValueError(
                f"checkpoint {prefix} holds state this model and optimizer do not have ({', '.join(unknown[:5])}): "
                "was the model changed since it was saved?"
            )
        wanted = {key: template[key] for key in refs}
        try:
            dcp.load(wanted, storage_reader=SafeFileSystemReader(folder, listed), process_group=self.group)
        except CheckpointException as exc:  # raised on every rank alike; the next candidate rewrites every tensor
            raise _Rejected(f"DCP could not read it: {str(exc).splitlines()[-1][:500]}") from None
        restored = join_tensors(shared, wanted)
        if state.optimizer is not None:
            set_state_dict(
                state.model,
                state.optimizer,
                model_state_dict=restored["model"],
                optim_state_dict=restored["optim"],
            )
        else:
            set_state_dict(state.model, [], model_state_dict=restored["model"], optim_state_dict={})
        problems = []
        if own.name in listed:
            try:
                restore_rng(personal["rng"])
            except (TypeError, ValueError, RuntimeError, IndexError, OverflowError) as exc:
                problems.append(f"{own.name}: RNG state not restorable ({type(exc).__name__}: {str(exc)[:200]})")
        self._reject_if_any(problems)
        for name, obj in state.extras.items():
            if name in personal["extras"]:
                obj.load_state_dict(personal["extras"][name])
        return Restored(manifest.step, prefix, tier, manifest.total_bytes, load_s=time.perf_counter() - began)

    def _reject_if_any(self, problems: list[str]) -> None:
        """Collective: every rank rejects the candidate when any rank found a problem."""
        seen = list(dict.fromkeys(p for g in self._all_gather(problems) for p in g))
        if seen:
            raise _Rejected("; ".join(seen))

    # ---- helpers ------------------------------------------------------------------------------

    def model_state(self, state: Stateful) -> dict[str, torch.Tensor]:
        return dict(self._state_dicts(state)[0])

    def _state_dicts(self, state: Stateful) -> tuple[dict, dict]:
        optimizers = [state.optimizer] if state.optimizer is not None else []
        return get_state_dict(state.model, optimizers)

    def _all_gather(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value, group=self.group)
        return gathered

    def _broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

