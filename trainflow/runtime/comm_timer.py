"""How long a step waits in gradient synchronisation, without touching DDP's communication.

Two stamps per step, both taken on the training thread: when the gradient of the model's first
parameter is accumulated (in backward it is computed last, so this rank's own work is done) and
when the optimizer step begins (DDP has then waited for every bucket's all-reduce). The time
between is waiting for the other ranks. A straggler computes long and waits little; the others
wait for it.

A Python comm hook would measure the all-reduce itself, but it replaces DDP's C++ all-reduce with
a Python callback run from the communication thread, which costs a small model a fifth of its
throughput; these two hooks cost a function call each.
"""

from __future__ import annotations

import time

import torch


class CommTimer:
    def __init__(self):
        self.grads_ready_at: float | None = None
        self.optimizer_at: float | None = None

    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> bool:
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            return False
        first = next((p for p in model.parameters() if p.requires_grad), None)
        if first is None:
            return False
        first.register_post_accumulate_grad_hook(self._grads_ready)
        if optimizer is not None:
            optimizer.register_step_pre_hook(self._optimizer_starts)
        return True

    def _grads_ready(self, _parameter) -> None:
        self.grads_ready_at = time.perf_counter()

    def _optimizer_starts(self, _optimizer, _args, _kwargs) -> None:
        self.optimizer_at = time.perf_counter()

    def take(self, began: float, ended: float) -> float:
        """Seconds of the step between this rank's gradients being ready and the optimizer step
        (the step's end when no optimizer step was seen)."""
        ready, synced = self.grads_ready_at, self.optimizer_at
        self.grads_ready_at = self.optimizer_at = None
        if ready is None or not began <= ready <= ended:
            return 0.0
        if synced is None or not ready <= synced <= ended:
            synced = ended
        return synced - ready
