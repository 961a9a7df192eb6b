"""A rank's copies of its own training state in host memory: what an in-process restart goes back
to (runtime/in_place.py) without reading storage.

The two newest copies are kept, in two slots of buffers used in turn, so a copy costs one memcpy of
the state and no allocation once both exist. Two, because ranks are at most one copy apart when a
failure stops them: a rank whose peer failed late in a step may have finished the step and copied
it, and every rank must go back to the same step. Each rank copies only what it holds (its shards
of a sharded model), with the RNG states and the extras' positions, as a checkpoint does.

Where the node's agent gave the ranks a shared-memory folder (backends/shared_copies.py), each slot
is a file there, mapped: the copies outlive the process, and a rank started in place of one that
died takes its copies over (`left_in`). A slot's description is removed before its buffers are
written and written again after, so a process that dies mid-copy leaves the other slot whole.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import set_state_dict

from trainflow.runtime.state import join_tensors, local_part, split_tensors
from trainflow.runtime.state_io import Stateful, state_dicts

COST_SHARE = 0.02  # a copy may cost this share of the training time, when its cadence is chosen
RNG = "__rng__."  # the RNG states' tensors, beside the state's own (whose keys start model. or optim.)
ALIGN = 64


@dataclass
class Copy:
    step: int
    slot: int
    tensors: dict[str, torch.Tensor]  # this rank's own values (a DTensor's local shard) and its RNG states
    shared: Any  # the state's non-tensor values, tensors replaced by references
    rng: dict  # the RNG states' scalars
    extras: str  # JSON: the extras' state_dicts as they were


class MemoryCopies:
    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder  # None: private memory, gone with the process
        self._copies: list[Copy] = []  # oldest first, at most two
        self._buffers: dict[int, dict[str, torch.Tensor]] = {}
        self.last_cost_s = 0.0

    @property
    def steps(self) -> list[int]:
        return [c.step for c in self._copies]

    def take(self, step: int, state: Stateful) -> float:
        """Copy the live state of `step`; returns the seconds it took."""
        began = time.perf_counter()
        model_sd, optim_sd = state_dicts(state)
        live, shared = split_tensors({"model": model_sd, "optim": optim_sd})
        rng_tensors, rng = _rng()
        values = {**{key: local_part(value).detach() for key, value in live.items()}, **rng_tensors}
        slot = self._free_slot()
        self._copies = [c for c in self._copies if c.slot != slot]
        self._forget(slot)
        tensors = self._buffers_for(slot, values)
        for key, value in values.items():
            tensors[key].copy_(value)
        copy = Copy(step, slot, tensors, shared, rng, json.dumps({n: o.state_dict() for n, o in state.extras.items()}))
        self._describe(copy)
        self._copies.append(copy)
        self.last_cost_s = time.perf_counter() - began
        return self.last_cost_s

    def restore(self, step: int, state: Stateful) -> float:
        """Load the copy of `step` into the (new) live objects; returns the seconds it took."""
        began = time.perf_counter()
        copy = next(c for c in self._copies if c.step == step)
        model_sd, optim_sd = state_dicts(state)
        template, _ = split_tensors({"model": model_sd, "optim": optim_sd})
        held = {key for key in copy.tensors if not key.startswith(RNG)}
        missing = sorted(held ^ set(template))
        if missing:
            raise RuntimeError(f"the in-memory copy does not fit the model: {', '.join(missing[:5])}")
        for key, value in template.items():
            local_part(value).copy_(copy.tensors[key])
        restored = join_tensors(copy.shared, template)
        set_state_dict(
            state.model,
            [state.optimizer] if state.optimizer is not None else [],
            model_state_dict=restored["model"],
            optim_state_dict=restored["optim"] if state.optimizer is not None else {},
        )
        _set_rng(copy.tensors, copy.rng)
        saved = json.loads(copy.extras)
        for name, obj in state.extras.items():
            if name in saved:
                obj.load_state_dict(saved[name])
        # the older copy is of no use once training goes on from this one
        for other in [c for c in self._copies if c is not copy]:
            self._forget(other.slot)
        self._copies = [copy]
        return time.perf_counter() - began

    @classmethod
    def left_in(cls, folder: Path) -> MemoryCopies:
        """The copies a rank's process left in its shared-memory folder, whole ones only: what the
        process started in its place goes on from."""
        copies = cls(folder)
        for slot in (0, 1):
            try:
                layout = json.loads((folder / f"slot-{slot}.layout.json").read_text())
                described = json.loads((folder / f"slot-{slot}.json").read_text())
            except (OSError, ValueError):
                continue
            tensors = _map(folder / f"slot-{slot}.bin", layout)
            copies._buffers[slot] = tensors
            copies._copies.append(
                Copy(described["step"], slot, tensors, described["shared"], described["rng"], described["extras"])
            )
        copies._copies.sort(key=lambda c: c.step)
        return copies

    # ---- slots -----------------------------------------------------------------------------------

    def _free_slot(self) -> int:
        used = [c.slot for c in self._copies]
        if len(used) < 2:
            return next(slot for slot in (0, 1) if slot not in used)
        return self._copies[0].slot  # the oldest

    def _forget(self, slot: int) -> None:
        """The slot holds no copy any more: its description goes before its buffers are written."""
        if self.folder is not None:
            try:
                os.unlink(self.folder / f"slot-{slot}.json")
            except FileNotFoundError:
                pass

    def _describe(self, copy: Copy) -> None:
        if self.folder is None:
            return
        path = self.folder / f"slot-{copy.slot}.json"
        described = {"step": copy.step, "shared": copy.shared, "rng": copy.rng, "extras": copy.extras}
        _write(path, json.dumps(described))

    def _buffers_for(self, slot: int, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        held = self._buffers.get(slot)
        if held is not None and _same_shapes(held, values):
            return held
        tensors = None
        if self.folder is not None:
            try:
                tensors = _allocate(self.folder, slot, values)
            except OSError as exc:  # shared memory full: this rank's copies die with it from now on
                print(
                    f"trainflow: in-memory copies kept in this process only ({os.strerror(exc.errno or errno.EIO)} "
                    f"in {self.folder}): a process started in its place cannot take them over",
                    file=sys.stderr,
                    flush=True,
                )
                self.folder = None
        if tensors is None:
            tensors = {key: torch.empty(v.shape, dtype=v.dtype, device="cpu") for key, v in values.items()}
        self._buffers[slot] = tensors
        return tensors


def every_steps(copy_s: float, step_s: float) -> int:
    """The cadence that keeps copies at COST_SHARE of the training time: every step where that allows."""
    if step_s <= 0:
        return 1
    needed = round(copy_s / (COST_SHARE * step_s), 9)  # 5.000000000000001 is 5
    return max(1, min(1_000_000, math.ceil(needed)))


def _same_shapes(old: dict[str, torch.Tensor], live: dict[str, torch.Tensor]) -> bool:
    if old.keys() != live.keys():
        return False
    return all(o.shape == live[k].shape and o.dtype == live[k].dtype for k, o in old.items())


def _allocate(folder: Path, slot: int, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A slot's buffers in a file of the shared-memory folder, reserved whole: a full tmpfs fails
    here, not with a SIGBUS at the first write past its end."""
    layout, offset = [], 0
    for key, value in values.items():
        nbytes = value.numel() * value.element_size()
        layout.append([key, str(value.dtype).removeprefix("torch."), list(value.shape), offset, nbytes])
        offset += -(-nbytes // ALIGN) * ALIGN
    path = folder / f"slot-{slot}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 0)
        if offset:
            os.posix_fallocate(fd, 0, offset)
    finally:
        os.close(fd)
    _write(folder / f"slot-{slot}.layout.json", json.dumps({"size": offset, "tensors": layout}))
    return _map(path, {"size": offset, "tensors": layout})


def _map(path: Path, layout: dict) -> dict[str, torch.Tensor]:
    size = layout["size"]
    if not size:
        return {key: torch.empty(shape, dtype=getattr(torch, dtype)) for key, dtype, shape, _, _ in layout["tensors"]}
    flat = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
    tensors = {}
    for key, dtype, shape, offset, nbytes in layout["tensors"]:
        kind = getattr(torch, dtype)
        tensors[key] = flat[offset : offset + nbytes].view(kind).view(shape)
    return tensors


def _write(path: Path, text: str) -> None:
    part = path.with_name(path.name + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(part, path)


def _rng() -> tuple[dict[str, torch.Tensor], dict]:
    version, internal, gauss = random.getstate()
    name, keys, position, has_gauss, cached = np.random.get_state()
    tensors = {
        f"{RNG}python": torch.tensor(internal, dtype=torch.int64),
        f"{RNG}numpy": torch.from_numpy(keys.view(np.int32).copy()),
        f"{RNG}torch": torch.get_rng_state(),
    }
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    tensors.update({f"{RNG}cuda.{i}": state for i, state in enumerate(cuda)})
    scalars = {
        "python": [version, gauss],
        "numpy": [name, int(position), int(has_gauss), float(cached)],
        "cuda": len(cuda),
    }
    return tensors, scalars


def _set_rng(tensors: dict[str, torch.Tensor], scalars: dict) -> None:
    version, gauss = scalars["python"]
    random.setstate((version, tuple(tensors[f"{RNG}python"].tolist()), gauss))
    name, position, has_gauss, cached = scalars["numpy"]
    keys = tensors[f"{RNG}numpy"].numpy().view(np.uint32).copy()
    np.random.set_state((name, keys, position, has_gauss, cached))
    torch.set_rng_state(tensors[f"{RNG}torch"].clone())
    if scalars["cuda"]:
        torch.cuda.set_rng_state_all([tensors[f"{RNG}cuda.{i}"].clone() for i in range(scalars["cuda"])])
