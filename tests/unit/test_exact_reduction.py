"""A restart rebuilds DDP; with four real gloo ranks the resumed training must still end
bit-identical to an uninterrupted one (trainflow.runtime.exact_reduction)."""

from __future__ import annotations

import copy
import hashlib
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainflow.runtime.exact_reduction import reduce_each_parameter

WORLD = 4
STEPS = 12
RESTART_AT = 6


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def _wrap(state: tuple[dict, dict] | None, exact: bool) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    module = _net()
    if state is not None:
        module.load_state_dict(state[0])
    model = DistributedDataParallel(module)
    if exact:
        assert reduce_each_parameter(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if state is not None:
        optimizer.load_state_dict(state[1])
    return model, optimizer


def _train(rank: int, port: int, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    generator = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(16, 64, generator=generator), torch.randint(0, 10, (16,), generator=generator))
               for _ in range(STEPS)]
    for name, exact, restart in (("uninterrupted", True, False), ("restarted", True, True), ("plain", False, False)):
        model, optimizer = _wrap(None, exact)
        for step, (x, y) in enumerate(batches):
            if restart and step == RESTART_AT:  # what a restore does: a new DDP around the saved state
                saved = (copy.deepcopy(model.module.state_dict()), copy.deepcopy(optimizer.state_dict()))
                model, optimizer = _wrap(saved, exact)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        params = [p.detach().clone() for p in model.module.parameters()]
        results[(name, rank)] = (hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest(), params)
    dist.destroy_process_group()


def test_a_rebuilt_ddp_on_four_ranks_ends_bit_identical_and_still_averages():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_train, args=(port, results), nprocs=WORLD, join=True)
    uninterrupted = {results[("uninterrupted", r)][0] for r in range(WORLD)}
    restarted = {results[("restarted", r)][0] for r in range(WORLD)}
    assert len(uninterrupted) == 1, "every replica holds the same parameters"
    assert restarted == uninterrupted
    # the gradients are really averaged: the same training as DDP's own all-reduce, up to rounding
    for ours, theirs in zip(results[("uninterrupted", 0)][1], results[("plain", 0)][1]):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
