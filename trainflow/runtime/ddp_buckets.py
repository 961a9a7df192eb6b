"""A resumed DDP reduces with the bucket layout of the run it resumes, so it stays bit-identical,
and keeps DDP's own layout, so communication still overlaps the backward pass.

DDP copies each bucket's gradients into one flat buffer and all-reduces the buffers in bucket
order. A new DDP reduces its first iteration with every parameter in one bucket; after that first
backward it rebuilds the buckets in the order the gradients became ready (the last layers first,
so their all-reduce runs while the earlier layers' gradients are computed), and keeps them. With
three ranks or more gloo's all-reduce adds an element's values in an order set by where the
element lies in the buffer, and floating-point addition is not associative: the first step after
a restart (a new DDP, one bucket) added the gradients in another order than the same step of an
uninterrupted run (rebuilt layout), and the runs parted by one rounding. (With two ranks every
element is a single addition, which commutes: exact whatever the layout.)

So the order in which the first backward made the gradients ready is recorded and checkpointed
with the rank's state, and a restored DDP is shown that order before its first forward: one
backward per parameter, in that order, each accumulating a zero gradient, inside one reducer
iteration. The reducer records the order from its own autograd hooks, reduces that iteration's
zeros (one all-reduce of the model's size, as a first iteration does) and at the next forward
builds the very buckets of the uninterrupted run. The parameters' gradients are put back as they
were. A fresh run is left to DDP alone.

This drives the reducer through `prepare_for_backward`, which is internal to DDP;
tests/unit/test_ddp_buckets.py fails if a torch upgrade changes it. A static-graph DDP counts the
hooks of its first iteration, which this would spoil: it is given every parameter in parameter
order instead (`_push_all_rebuilt_params`, what DDP's Join uses), exact but without overlap. A DDP
that looks for unused parameters never rebuilds its buckets and needs nothing.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def reducer_parameters(model: DistributedDataParallel) -> list[torch.nn.Parameter]:
    """The parameters the reducer holds, in its order (as DDP builds them: per module, shared ones
    once, frozen and ignored ones left out; ignored names spelt as DDP spells them)."""
    ignored = set(getattr(model, "parameters_to_ignore", ()))
    seen: set[int] = set()
    params = []
    for module_name, module in model.module.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad and f"{module_name}.{name}" not in ignored and id(param) not in seen:
                seen.add(id(param))
                params.append(param)
    return params


def _warn(message: str) -> None:
    print(f"trainflow: warning: {message}", file=sys.stderr, flush=True)


def _sparse(model: DistributedDataParallel) -> bool:
    return any(isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse for m in model.modules())


class BucketOrder:
    """Registered with the training state (a JSON extra): saves the order the first backward made the
    gradients ready; restored, hands it to the new reducer before the first forward (`apply`)."""

    def __init__(self, model: torch.nn.Module):
        self.order: list[int] | None = None
        self._seen: dict[int, None] = {}  # ordered, and quick to ask
        self._loaded: Any = None
        self._hooks: list[Any] = []
        ddp = model if isinstance(model, DistributedDataParallel) else None
        self._params = reducer_parameters(ddp) if ddp is not None else []
        if ddp is not None and getattr(ddp, "static_graph", False):
            ddp.reducer._push_all_rebuilt_params()
            ddp = None
        elif ddp is not None and (getattr(ddp, "find_unused_parameters", False) or _sparse(ddp)):
            ddp = None  # never rebuilds its buckets; or sparse gradients, which a zero cannot stand for
        self._ddp = ddp if self._params else None
        if self._ddp is not None:
            self._hooks = [p.register_post_accumulate_grad_hook(self._ready(i)) for i, p in enumerate(self._params)]

    # ---- the training state's JSON extra ------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"order": self.order}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loaded = state.get("order") if isinstance(state, dict) else None

    # ---- recording ------------------------------------------------------------------------------

    def _ready(self, index: int):
        def hook(_param) -> None:
            if self.order is None and index not in self._seen:
                self._seen[index] = None
                if len(self._seen) == len(self._params):
                    self.order = list(self._seen)

        return hook

    @property
    def recording(self) -> bool:
        return bool(self._hooks)

    def stop_recording(self) -> None:
        """Between steps (a hook must not remove hooks while autograd runs them): once the order is
        complete the hooks go."""
        if self.order is not None:
            self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # ---- replaying ------------------------------------------------------------------------------

    def apply(self, group: dist.ProcessGroup | None = None) -> bool:
        """Collective (every rank, before the first forward): replay the restored order into the
        reducer. False when there is none to replay (a fresh run, an older checkpoint, not DDP)."""
        order, self._loaded = self._loaded, None
        if self._ddp is None:
            return False
        fits = [False] * dist.get_world_size(group)
        dist.all_gather_object(fits, self._fits(order), group=group)  # one rank alone must not all-reduce
        if not all(fits):
            if order is not None:
                _warn(
                    f"the checkpoint's DDP bucket order does not fit this model's {len(self._params)} "
                    "parameters on every rank; with more than two ranks the resumed run may differ from "
                    "an uninterrupted one in the last bits"
                )
            return False
        self._remove_hooks()
        grads = [p.grad for p in self._params]
        self._ddp.reducer.prepare_for_backward([])
        with torch.enable_grad():
            for index in order:
                param = self._params[index]
                param.backward(torch.zeros_like(param))
        for param, grad in zip(self._params, grads):
            param.grad = grad
        self.order = list(order)
        return True

    def _fits(self, order: Any) -> bool:
        """A permutation of the reducer's parameters (the checkpoint's JSON is not trusted)."""
        return (
            isinstance(order, list)
            and all(type(i) is int for i in order)
            and sorted(order) == list(range(len(self._params)))
        )
