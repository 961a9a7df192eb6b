"""The reference workload under bare torchrun, without trainflow: the same model, data order and
optimizer, no heartbeats, checkpoints or control points. The yardstick for trainflow's tax.

    torchrun --nnodes 1 --nproc-per-node 2 bench/bare_digits.py --steps 300 --out timings.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "digits"))
from train import DigitsNet, ShardedBatches, load_digits  # noqa: E402  (the reference workload's own parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    started = time.time()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    images, targets = load_digits()
    features = torch.tensor(images, dtype=torch.float32) / 16.0
    labels = torch.tensor(targets, dtype=torch.long)
    batches = ShardedBatches(features, labels, 64, rank, world, args.seed)
    torch.manual_seed(args.seed)
    model = DDP(DigitsNet(128))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    stamps = []
    for _ in range(args.steps):
        x, y = batches.next()
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        stamps.append(time.time())
    if rank == 0:
        with open(args.out, "w") as handle:
            json.dump({"launched_at": float(os.environ.get("BENCH_LAUNCHED_AT", started)), "stamps": stamps}, handle)
    dist.barrier()  # a rank may abort at exit while its peer still ends the last collective (docs/scripts.md)
    del model, optimizer, loss  # before the group: freed after it, it can deadlock at exit (docs/scripts.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
