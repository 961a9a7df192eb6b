"""The FSDP2 + TP example under bare torchrun, without trainflow: the same model, layout (a 2-D
mesh "dp" x "tp", tensor-parallel pairs innermost), data and optimizer; no heartbeats,
checkpoints or control points. The yardstick for trainflow's tax on examples/fsdp_tp.

    torchrun --standalone --nproc-per-node 4 bench/bare_fsdp_tp.py --tp 2 --steps 300 --out timings.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "fsdp_tp"))
from train import TinyTransformer, batch, tensor_parallel  # noqa: E402  (the example's own parts)


@dataclass(frozen=True)
class Layout:
    """What `batch` reads of `run.parallel`: this rank's data-parallel index and the degree."""

    data_rank: int
    data: int


@dataclass(frozen=True)
class BareRun:
    parallel: Layout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)  # examples/fsdp_tp/spec.yaml
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    started = time.time()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(args.seed)
    # the example's defaults: dim 32, 4 heads, 2 layers, vocab 64, seq 16, global batch 16, lr 3e-3
    vocab, seq, global_batch = 64, 16, 16
    model = TinyTransformer(vocab, 32, 4, 2, seq)
    tensor_parallel(model, mesh["tp"])
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    run = BareRun(Layout(data_rank=mesh["dp"].get_local_rank(), data=world // args.tp))
    stamps = []
    for step in range(1, args.steps + 1):
        inputs, targets = batch(step, args.seed, global_batch, seq, vocab, run)
        loss = F.cross_entropy(model(inputs).reshape(-1, vocab), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        reported = loss.detach().clone()
        dist.all_reduce(reported)  # the example reports the global loss every step: the same collective here
        stamps.append(time.time())
    if rank == 0:
        with open(args.out, "w") as handle:
            json.dump({"launched_at": float(os.environ.get("BENCH_LAUNCHED_AT", started)), "stamps": stamps}, handle)
    dist.barrier()  # a rank may abort at exit while its peer still ends the last collective (docs/scripts.md)
    del model, optimizer, loss  # before the group: freed after it, it can deadlock at exit (docs/scripts.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
