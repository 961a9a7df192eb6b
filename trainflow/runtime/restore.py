"""Restoring (every rank): candidates newest first — a local copy before the durable one of the
same step, then older ones. Every file is checked against the manifest (size, sha256) before DCP
reads anything; a candidate that fails is skipped with a reason. A local copy is spread over the
nodes that wrote it: each node first gets what it lacks from the others. DCP reshards, so a
checkpoint written at one world size loads at another.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field, replace

import torch.distributed as dist

from trainflow.checkpoint.catalog import Committed, list_committed, missing_or_resized, read_manifest, run_of, step_of
from trainflow.checkpoint.exchange import broadcast_file
from trainflow.checkpoint.local_tier import Held
from trainflow.checkpoint.manifest import MANIFEST_NAME, Manifest, ManifestError, verify_files
from trainflow.checkpoint.storage import StorageError
from trainflow.contracts.status_protocol import Checkpoint
from trainflow.runtime.checkpoint_context import CheckpointContext, warn
from trainflow.runtime.state_io import Rejected, Stateful, load


class CheckpointInvalid(RuntimeError):
    """No checkpoint the orchestrator pointed at, nor an older one, matched its manifest."""


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


@dataclass(frozen=True)
class Candidate:
    prefix: str
    step: int
    tier: str
    order: float = 0.0  # among local copies of one step, the later save first
    holders: dict[int, Held] = field(default_factory=dict)  # local: leader rank -> what its node holds


class Restorer:
    def __init__(self, ctx: CheckpointContext):
        self.ctx = ctx

    def restore(self, prefix: str | None, state: Stateful) -> Restored | None:
        """Collective. Load the newest checkpoint that verifies: this run's local copies, `prefix`
        (the orchestrator's choice) and the older committed checkpoints of its run. None: start
        fresh. Raises CheckpointInvalid when `prefix` was given and nothing could be loaded."""
        began = time.perf_counter()
        fallbacks: list[str] = []
        for candidate in self._candidates(prefix):
            try:
                if candidate.tier == "local":
                    restored = self._local(candidate, state)
                else:
                    restored = self._durable(candidate, state)
            except Rejected as exc:
                reason = str(exc)
                fallbacks.append(f"{candidate.tier} step {candidate.step} ({candidate.prefix}): {reason}")
                warn(
                    f"not restoring the {candidate.tier} checkpoint of step {candidate.step} "
                    f"({candidate.prefix}): {reason}"
                )
                if self.ctx.rank == 0 and candidate.tier == "durable":
                    self.ctx.send(
                        Checkpoint(
                            step=candidate.step,
                            prefix=candidate.prefix,
                            status="rejected",
                            reason=reason[:2000],
                            bytes=0,
                            stall_s=0.0,
                        )
                    )
                continue
            return replace(restored, seconds=time.perf_counter() - began, fallbacks=tuple(fallbacks))
        if prefix:
            raise CheckpointInvalid(f"no checkpoint could be restored: {'; '.join(fallbacks)}")
        return None

    def _candidates(self, prefix: str | None) -> list[Candidate]:
        local: list[Candidate] = []
        if self.ctx.config.local_tier:
            mine = self.ctx.tier.inventory(self.ctx.config.run_id) if self.ctx.leader else []
            everyone = self.ctx.all_gather({"rank": self.ctx.rank, "leader": self.ctx.leader, "held": mine})
            by_prefix: dict[str, dict[int, Held]] = {}
            for g in everyone:
                if g["leader"]:
                    for held in g["held"]:
                        by_prefix.setdefault(held.prefix, {})[g["rank"]] = held
            for local_prefix, holders in by_prefix.items():
                manifests = [h.manifest() for h in holders.values() if h.manifest() is not None]
                if manifests:
                    order = max(m.committed_at for m in manifests)
                    local.append(Candidate(local_prefix, step_of(local_prefix) or 0, "local", order, holders))
        durable: list[Candidate] = []
        if prefix:
            listed = None
            if self.ctx.rank == 0:
                first = step_of(prefix) or 0
                listed = [(prefix, first)]
                try:
                    older = [c for c in list_committed(self.ctx.storage, run_of(prefix)) if c.step < first]
                    listed += [(c.prefix, c.step) for c in sorted(older, key=lambda c: c.step, reverse=True)]
                except StorageError:
                    pass  # the store cannot be listed: the orchestrator's choice is still worth a try
            durable = [Candidate(p, s, "durable") for p, s in self.ctx.broadcast(listed)]
        return sorted(local + durable, key=lambda c: (-c.step, c.tier != "local", -c.order))

    def _local(self, candidate: Candidate, state: Stateful) -> Restored:
        texts = {h.manifest_text for h in candidate.holders.values() if h.manifest_text is not None}
        if len(texts) != 1:
            raise Rejected("the nodes hold different manifests")
        try:
            manifest = Manifest.from_json(texts.pop())
        except ManifestError as exc:
            raise Rejected(str(exc)) from None
        folder = self.ctx.tier.folder(candidate.prefix)
        sizes = {e.name: e.size for e in manifest.files}

        began = time.perf_counter()
        good: set[str] = set()
        problems: list[str] = []
        if self.ctx.leader:
            held = candidate.holders.get(self.ctx.rank)
            names = {n for n in (held.present if held else {}) if n in sizes}
            problems = verify_files(manifest, folder, names)
            good = names - {p.split(":", 1)[0] for p in problems}
        everyone = self.ctx.all_gather(
            {"rank": self.ctx.rank, "leader": self.ctx.leader, "good": sorted(good), "problems": problems}
        )
        verify_s = time.perf_counter() - began
        leaders = [g["rank"] for g in everyone if g["leader"]]
        holders = {name: [g["rank"] for g in everyone if name in g["good"]] for name in sizes}
        missing = sorted(name for name, ranks in holders.items() if not ranks)
        if missing:
            seen = [p for g in everyone for p in g["problems"]]
            detail = f" ({'; '.join(seen)})" if seen else ""
            raise Rejected(f"no node holds an intact copy of {', '.join(missing)}{detail}")

        began = time.perf_counter()
        needs = {r: {name for name in sizes if r not in holders[name]} for r in leaders}
        for name in sorted(sizes):
            receivers = [r for r in leaders if name in needs[r]]
            if receivers:
                receiving = self.ctx.rank in receivers
                broadcast_file(self.ctx.group, min(holders[name]), folder / name, sizes[name], receiving)
        transfer_s = time.perf_counter() - began
        received = needs.get(self.ctx.rank, set())
        problems = verify_files(manifest, folder, received) if received else []
        if self.ctx.leader and not problems and not (folder / MANIFEST_NAME).exists():
            self.ctx.tier.commit(candidate.prefix, manifest)  # this node now holds the whole checkpoint
        seen = [p for g in self.ctx.all_gather(problems) for p in g]
        if seen:
            raise Rejected(f"copies received from other nodes do not match: {'; '.join(seen)}")
        load_s = load(self.ctx, folder, manifest, state, candidate.prefix)
        return Restored(
            manifest.step,
            candidate.prefix,
            "local",
            manifest.total_bytes,
            transfer_s=transfer_s,
            verify_s=verify_s,
            load_s=load_s,
        )

    def _durable(self, candidate: Candidate, state: Stateful) -> Restored:
        found = None
        if self.ctx.rank == 0:  # the manifest, and a cheap look at every file before downloading any
            try:
                manifest = read_manifest(self.ctx.storage, candidate.prefix)
                problems = missing_or_resized(self.ctx.storage, Committed(candidate.prefix, manifest))
                found = "; ".join(problems) if problems else manifest.to_json()
            except ManifestError as exc:
                found = f"manifest: {exc}"
            except StorageError as exc:
                found = str(exc)
        found = self.ctx.broadcast(found)
        if not found.startswith("{"):
            raise Rejected(found)
        manifest = Manifest.from_json(found)
        folder = self.ctx.scratch / "restore" / candidate.prefix.replace("/", "--")
        problems: list[str] = []
        transfer_s = verify_s = 0.0
        if self.ctx.leader:
            shutil.rmtree(folder, ignore_errors=True)
            began = time.perf_counter()
            try:
                with self.ctx.storage_call(f"downloading the checkpoint {candidate.prefix}"):
                    self.ctx.storage.download_many(
                        [(f"{candidate.prefix}/{e.name}", folder / e.name) for e in manifest.files]
                    )
            except StorageError as exc:
                problems = [str(exc)]
            transfer_s = time.perf_counter() - began
            if not problems:
                began = time.perf_counter()
                problems = verify_files(manifest, folder)
                verify_s = time.perf_counter() - began
        seen = [p for g in self.ctx.all_gather(problems) for p in g]
        try:
            if seen:
                raise Rejected("; ".join(seen))
            load_s = load(self.ctx, folder, manifest, state, candidate.prefix)
            dist.barrier(group=self.ctx.group)  # every rank of the node has read the folder
        finally:
            if self.ctx.leader:
                shutil.rmtree(folder, ignore_errors=True)
        return Restored(
            manifest.step,
            candidate.prefix,
            "durable",
            manifest.total_bytes,
            transfer_s=transfer_s,
            verify_s=verify_s,
            load_s=load_s,
        )
