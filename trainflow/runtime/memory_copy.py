"""A rank's copies of its own training state in its own memory: what an in-process restart goes
back to (runtime/in_place.py) without reading storage.

The two newest copies are kept, in two sets of buffers used in turn, so a copy costs one memcpy of
the state and no allocation once both exist. Two, because ranks are at most one copy apart when a
failure stops them: a rank whose peer failed late in a step may have finished the step and copied
it, and every rank must go back to the same step. Each rank copies only what it holds (its shards
of a sharded model), with the RNG states and the extras' positions, as a checkpoint does.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import set_state_dict

from trainflow.runtime.state import join_tensors, local_part, split_tensors
from trainflow.runtime.state_io import Stateful, state_dicts

COST_SHARE = 0.02  # a copy may cost this share of the training time, when its cadence is chosen


@dataclass
class Copy:
    step: int
    tensors: dict[str, torch.Tensor]  # this rank's own values (a DTensor's local shard)
    shared: Any  # the state's non-tensor values, tensors replaced by references
    rng: tuple
    extras: str  # JSON: the extras' state_dicts as they were


class MemoryCopies:
    def __init__(self) -> None:
        self._copies: list[Copy] = []  # oldest first, at most two
        self.last_cost_s = 0.0

    @property
    def steps(self) -> list[int]:
        return [c.step for c in self._copies]

    def take(self, step: int, state: Stateful) -> float:
        """Copy the live state of `step`; returns the seconds it took."""
        began = time.perf_counter()
        model_sd, optim_sd = state_dicts(state)
        live, shared = split_tensors({"model": model_sd, "optim": optim_sd})
        recycled = self._copies.pop(0) if len(self._copies) == 2 else None
        tensors = recycled.tensors if recycled is not None and _same_shapes(recycled.tensors, live) else {}
        for key, value in live.items():
            local = local_part(value).detach()
            if key in tensors:
                tensors[key].copy_(local)
            else:
                tensors[key] = local.clone()
        extras = json.dumps({name: obj.state_dict() for name, obj in state.extras.items()})
        self._copies.append(Copy(step, tensors, shared, _rng(), extras))
        self.last_cost_s = time.perf_counter() - began
        return self.last_cost_s

    def restore(self, step: int, state: Stateful) -> float:
        """Load the copy of `step` into the (new) live objects; returns the seconds it took."""
        began = time.perf_counter()
        copy = next(c for c in self._copies if c.step == step)
        model_sd, optim_sd = state_dicts(state)
        template, _ = split_tensors({"model": model_sd, "optim": optim_sd})
        missing = sorted(set(copy.tensors) ^ set(template))
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
        _set_rng(copy.rng)
        saved = json.loads(copy.extras)
        for name, obj in state.extras.items():
            if name in saved:
                obj.load_state_dict(saved[name])
        # the older copy is of no use once training goes on from this one
        self._copies = [copy]
        return time.perf_counter() - began


def every_steps(copy_s: float, step_s: float) -> int:
    """The cadence that keeps copies at COST_SHARE of the training time: every step where that allows."""
    if step_s <= 0:
        return 1
    needed = round(copy_s / (COST_SHARE * step_s), 9)  # 5.000000000000001 is 5
    return max(1, min(1_000_000, math.ceil(needed)))


def _same_shapes(old: dict[str, torch.Tensor], live: dict[str, torch.Tensor]) -> bool:
    return old.keys() == live.keys() and all(
        old[k].shape == local_part(v).shape and old[k].dtype == v.dtype for k, v in live.items()
    )


def _rng() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _set_rng(states: tuple) -> None:
    python, numpy, cpu, cuda = states
    random.setstate(python)
    np.random.set_state(numpy)
    torch.set_rng_state(cpu)
    if cuda:
        torch.cuda.set_rng_state_all(cuda)
