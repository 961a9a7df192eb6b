"""The control plane's cadences over real gloo ranks: the in-memory copies' cadence is fixed by rank 0
after the warm-up and fixed again from the steps since, the same on every rank."""

from __future__ import annotations

import torch.distributed as dist

from tests.spawned_ranks import free_port, run_ranks
from trainflow.runtime.control import MEMORY_RETUNE_EVERY, WARMUP_STEPS, ControlPlane


def _ranks(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    control = ControlPlane(rank, 2, divergence_every=0, memory_every_steps=None)
    # rank 1's own figures differ wildly: only rank 0's decide, for both
    slow, fast, copy = (0.010, 0.002, 0.001) if rank == 0 else (1.0, 1.0, 0.0)
    tuned_at = WARMUP_STEPS + 1
    for step in range(1, tuned_at + 1):  # the warm-up's steps, then the control point that fixes it
        control.agree(step, slow, None)
        control.memory_copy_took(copy)
    results[f"after_warmup_{rank}"] = control.memory_every
    for step in range(tuned_at + 1, tuned_at + 1 + MEMORY_RETUNE_EVERY):  # faster steps since
        control.agree(step, fast, None)
        if control.memory_copy_due(step):
            control.memory_copy_took(copy)
    results[f"after_retune_{rank}"] = control.memory_every
    dist.destroy_process_group()


def test_the_copies_cadence_follows_rank_0s_figures_after_the_warm_up_and_again_later():
    results = run_ranks(_ranks, (free_port(),), nprocs=2)
    # 1 ms copies on 10 ms steps: every 5 steps keeps them at 2%; on 2 ms steps, every 25
    assert results["after_warmup_0"] == results["after_warmup_1"] == 5
    assert results["after_retune_0"] == results["after_retune_1"] == 25
