"""Run.finish() leaves the process groups with a final barrier on each that the main thread keeps
(trainflow.runtime.leave_groups), so that a DDP model freed after its group was destroyed, and
the interpreter's exit, find gloo's worker threads idle. How often each ending hangs or aborts
without it is measured by bench/exit_race.py (a rare race: no test could show it reliably)."""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.spawned_ranks import free_port, run_ranks
from trainflow.runtime import leave_groups


def _train_then_leave_with_the_model_alive(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    control = dist.new_group(backend="gloo")  # a second group, as the control plane's
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
    groups = [group is dist.group.WORLD for group in leave_groups.every_group()]
    same_control = leave_groups.every_group()[1] is control
    leave_groups.leave_process_groups()
    kept = leave_groups._final_barriers
    del model  # its Reducer frees the default group now, with the GIL held
    gc.collect()
    results[rank] = dict(
        groups=groups,
        same_control=same_control,
        kept=len(kept),
        completed=all(work.is_completed() for work in kept),
        initialized=dist.is_initialized(),
    )
    # and the rank ends through the interpreter's own exit, the barriers' work still kept


def test_every_group_gets_a_kept_final_barrier_and_a_model_outliving_them_exits_cleanly():
    results = run_ranks(_train_then_leave_with_the_model_alive, (free_port(),), 2)
    for rank in range(2):
        assert results[rank]["groups"] == [True, False] and results[rank]["same_control"], "made first, first"
        assert results[rank]["kept"] == 2 and results[rank]["completed"], "one barrier per gloo group, kept"
        assert not results[rank]["initialized"], "the groups were destroyed as usual"
