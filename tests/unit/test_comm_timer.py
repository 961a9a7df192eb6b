"""The waiting-for-gradients figure, measured in two real gloo processes where one is slow."""

from __future__ import annotations

import gc
import socket
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.spawned_ranks import run_ranks
from trainflow.runtime.comm_timer import CommTimer

STEPS = 6
DELAY_S = 0.05


def _train(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    timer = CommTimer()
    assert timer.attach(model, optimizer)
    waits = []
    for _ in range(STEPS):
        began = time.perf_counter()
        if rank == 1:
            time.sleep(DELAY_S)  # the straggler's extra compute, before its gradients exist
        loss = model(torch.ones(4, 8)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        waits.append(timer.take(began, time.perf_counter()))
    results[rank] = waits
    del model, optimizer, timer  # torch 2.13's gloo can deadlock when a DDP outlives its group (docs/scripts.md)
    gc.collect()
    dist.destroy_process_group()


def test_the_fast_rank_waits_for_the_slow_one_and_the_slow_one_does_not():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = run_ranks(_train, (port,), 2)
    # medians: the first steps also wait for DDP's set-up and for the two processes to fall in step
    fast, slow = statistics.median(results[0]), statistics.median(results[1])
    assert fast > 0.6 * DELAY_S
    assert slow < 0.4 * DELAY_S


def test_without_ddp_nothing_is_attached_and_nothing_is_waited():
    timer = CommTimer()
    model = torch.nn.Linear(2, 1)
    assert timer.attach(model, torch.optim.SGD(model.parameters(), lr=0.1)) is False
    assert timer.take(0.0, 1.0) == 0.0
