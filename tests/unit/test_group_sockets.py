"""Breaking a rank's process groups off (runtime/group_sockets.py), over real gloo ranks: a peer
waiting on it in a collective fails while the rank's DDP model still holds the groups, where
destroying them alone leaves the peer waiting until the rank's process ends."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.spawned_ranks import free_port, run_ranks
from trainflow.runtime.group_sockets import break_off_groups, note_group_sockets

TIMEOUT_S = 120  # the groups' collective timeout: what a peer would otherwise wait


def _ranks(rank: int, port: int, break_off: bool, hold_s: float, results) -> None:
    note_group_sockets()
    init = f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S))
    dist.new_group(backend="gloo")  # a second group, as the runtime's control plane makes
    model = DDP(torch.nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()
    if rank == 1:
        # the rank that failed: its model (and so its groups) stays alive, as in a script's frames
        if break_off:
            results["shut"] = break_off_groups()
        else:
            dist.destroy_process_group()
        deadline = time.monotonic() + hold_s
        while "error" not in results and time.monotonic() < deadline:
            time.sleep(0.05)
        results["peer_failed_while_held"] = "error" in results and model is not None
        return
    try:
        model(torch.ones(2, 4)).sum().backward()  # waits on rank 1 in the all-reduce
        results["error"] = None
    except RuntimeError as exc:
        results["error"] = str(exc)


def test_a_peer_waiting_in_a_collective_fails_when_the_groups_are_broken_off():
    # rank 1 holds its model until rank 0's collective has failed (or the collective timeout)
    results = run_ranks(_ranks, (free_port(), True, TIMEOUT_S), nprocs=2)
    assert results["shut"] >= 2  # a connection of each group to the peer
    assert "Connection closed by peer" in results["error"]
    assert results["peer_failed_while_held"] is True


def test_destroying_the_groups_alone_leaves_the_peer_waiting():
    # rank 1 holds its model for 5 s: rank 0's collective fails only once rank 1's process ends
    results = run_ranks(_ranks, (free_port(), False, 5.0), nprocs=2)
    assert results["peer_failed_while_held"] is False
    assert "Connection closed by peer" in results["error"]
