"""The workers' control point: agree on a preemption, compare replicas.

At a control point every rank shares two numbers over a CPU (gloo) group: "I was asked to stop"
and a hash of the parameter values it holds (on divergence-check steps). Hashes are compared only
within replica groups: ranks that must hold equal values (replicas along the replicated
data-parallel dimension), never shards that differ by design (see runtime/sharding.py).
Control points come every step while the step time is unknown, then at a cadence fixed once by
rank 0 (about every CONTROL_PERIOD_S), so the check costs a fraction of a percent of training
time and every rank stops at the same step. The in-memory copies' cadence (runtime/memory_copy.py)
is fixed by rank 0 at the same point, and again every MEMORY_RETUNE_EVERY control points from the
steps and copies since: the warm-up's slower steps would otherwise leave copies too frequent.
"""

from __future__ import annotations

import signal
import time

import torch
import torch.distributed as dist

from trainflow.runtime.memory_copy import every_steps
from trainflow.runtime.state import local_params_hash

CONTROL_PERIOD_S = 0.25
WARMUP_STEPS = 10
MEMORY_RETUNE_EVERY = 40  # control points (about 10 s) between fixes of the memory copies' cadence


class ControlPlane:
    def __init__(self, rank: int, world_size: int, divergence_every: int, memory_every_steps: int | None = 0):
        """`memory_every_steps`: the in-memory copies' cadence (runtime/memory_copy.py); 0: no copies,
        None: every step during the warm-up, then as often as their cost allows, fixed by rank 0."""
        self.rank = rank
        self.world_size = world_size
        self.divergence_every = divergence_every
        self.group = dist.new_group(backend="gloo")
        # ranks whose parameter values must be equal; every rank alone until a model is registered
        self.replica_groups: list[list[int]] = [[r] for r in range(world_size)]
        self.preempt_requested_at: float | None = None
        self._every = 1
        self._tuned = False
        self._warmup_until: int | None = None
        self._warmup_time = 0.0
        self._copies_on = memory_every_steps != 0
        self._memory_auto = memory_every_steps is None
        self._memory_every = memory_every_steps or 1
        self._memory_cost = 0.0  # the copies' seconds during the warm-up
        # since the cadence was last fixed: the copies' seconds, and the control points' step times
        self._recent_copies_s, self._recent_copies = 0.0, 0
        self._recent_steps_s, self._recent_steps = 0.0, 0
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        # only a flag: the checkpoint happens at the next control point, on every rank together
        if self.preempt_requested_at is None:
            self.preempt_requested_at = time.time()

    @property
    def memory_every(self) -> int:
        """The in-memory copies' cadence in steps (the same on every rank)."""
        return self._memory_every

    def memory_copy_due(self, step: int) -> bool:
        return self._copies_on and step % self._memory_every == 0

    def memory_copy_took(self, seconds: float) -> None:
        if not self._tuned:
            self._memory_cost += seconds
        self._recent_copies_s += seconds
        self._recent_copies += 1

    def due(self, step: int) -> bool:
        return step % self._every == 0 or self._divergence_step(step)

    def _divergence_step(self, step: int) -> bool:
        return bool(self.divergence_every) and step % self.divergence_every == 0

    def agree(
        self, step: int, step_time_s: float, model: torch.nn.Module | None, verify: bool = False
    ) -> tuple[bool, list[int] | None]:
        """Collective at a control point: (someone must stop, every rank's parameter hash or None).
        Hashes are compared on divergence-check steps and, with `verify`, before a checkpoint."""
        self._retune_memory_copies(step_time_s)  # from the control point after the warm-up's on
        self._tune_cadence(step, step_time_s)
        check = (
            bool(self.divergence_every)
            and (verify or self._divergence_step(step))
            and model is not None
            and self.has_replicas
        )
        mine = torch.tensor(
            [int(self.preempt_requested_at is not None), local_params_hash(model) if check else 0], dtype=torch.int64
        )
        everyone = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(everyone, mine, group=self.group)
        stop = any(int(t[0]) for t in everyone)
        hashes = [int(t[1]) for t in everyone] if check else None
        return stop, hashes

    @property
    def has_replicas(self) -> bool:
        return any(len(group) > 1 for group in self.replica_groups)

    def diverged(self, hashes: list[int]) -> list[list[int]]:
        """The replica groups whose members hold different values."""
        return [group for group in self.replica_groups if len({hashes[r] for r in group}) > 1]

    def _retune_memory_copies(self, step_time_s: float) -> None:
        """The warm-up's steps are slower than the later ones: every MEMORY_RETUNE_EVERY control
        points rank 0 fixes the copies' cadence again from the figures since, for every rank."""
        if not (self._tuned and self._memory_auto and self._copies_on):
            return
        self._recent_steps_s += step_time_s
        self._recent_steps += 1
        if self._recent_steps < MEMORY_RETUNE_EVERY:
            return
        proposed = self._memory_every
        if self._recent_copies:
            proposed = every_steps(
                self._recent_copies_s / self._recent_copies, self._recent_steps_s / self._recent_steps
            )
        chosen = torch.tensor([proposed], dtype=torch.int64)
        dist.broadcast(chosen, src=0, group=self.group)
        self._memory_every = int(chosen[0])
        self._recent_copies_s, self._recent_copies = 0.0, 0
        self._recent_steps_s, self._recent_steps = 0.0, 0

    def _tune_cadence(self, step: int, step_time_s: float) -> None:
        if self._warmup_until is None:
            self._warmup_until = step + WARMUP_STEPS
        if self._tuned:
            return
        if step < self._warmup_until:
            self._warmup_time += step_time_s
            return
        mean = self._warmup_time / WARMUP_STEPS
        memory_every = every_steps(self._memory_cost / WARMUP_STEPS, mean) if self._memory_auto else self._memory_every
        chosen = torch.tensor(
            [max(1, min(1000, round(CONTROL_PERIOD_S / max(mean, 1e-6)))), memory_every], dtype=torch.int64
        )
        dist.broadcast(chosen, src=0, group=self.group)  # rank 0's figures: every rank the same cadences
        self._every = int(chosen[0])
        self._memory_every = int(chosen[1])
        self._tuned = True
