"""A restart rebuilds DDP; with four real gloo ranks the resumed training must still end
bit-identical to an uninterrupted one (trainflow.runtime.ddp_buckets)."""

from __future__ import annotations

import copy
import hashlib
import itertools
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainflow.runtime.ddp_buckets import fix_bucket_layout

WORLD = 4
STEPS = 12
RESTART_AT = 6
BUCKET_CAPS_MB = (None, 0.03)  # DDP's default (one bucket for this model), and several buckets


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def _wrap(state: tuple[dict, dict] | None, exact: bool, bucket_cap_mb: float | None
          ) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    module = _net()
    if state is not None:
        module.load_state_dict(state[0])
    model = DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)
    if exact:
        assert fix_bucket_layout(model)
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
    runs = [("uninterrupted", True, False), ("restarted", True, True), ("plain", False, False)]
    for (name, exact, restart), cap in itertools.product(runs, BUCKET_CAPS_MB):
        name = f"{name} {cap}"
        model, optimizer = _wrap(None, exact, cap)
        for step, (x, y) in enumerate(batches):
            if restart and step == RESTART_AT:  # what a restore does: a new DDP around the saved state
                saved = (copy.deepcopy(model.module.state_dict()), copy.deepcopy(optimizer.state_dict()))
                model, optimizer = _wrap(saved, exact, cap)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        params = [p.detach().clone() for p in model.module.parameters()]
        results[(name, rank)] = (hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest(), params)
    dist.destroy_process_group()


def test_a_ddp_rebuilt_mid_training_on_four_ranks_ends_bit_identical():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_train, args=(port, results), nprocs=WORLD, join=True)
    for cap in BUCKET_CAPS_MB:
        uninterrupted = {results[(f"uninterrupted {cap}", r)][0] for r in range(WORLD)}
        restarted = {results[(f"restarted {cap}", r)][0] for r in range(WORLD)}
        assert len(uninterrupted) == 1, "every replica holds the same parameters"
        assert restarted == uninterrupted, f"bucket_cap_mb={cap}"
        # still DDP's training: the same parameters as with its usual layouts, up to rounding
        for ours, theirs in zip(results[(f"uninterrupted {cap}", 0)][1], results[(f"plain {cap}", 0)][1]):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
