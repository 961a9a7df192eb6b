"""A plain torchrun script: it never imports trainflow, trains a few DDP steps and exits 0, or
raises or starts slowly when asked."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--raise-on-rank", type=int, default=None)
    parser.add_argument("--sleep-before-init", type=float, default=0.0)
    args = parser.parse_args()
    time.sleep(args.sleep_before_init)  # a slow start: imports, data download, compilation
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == args.raise_on_rank:
        raise RuntimeError(f"the data folder /data/shard-{rank} is empty")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} done", flush=True)
    dist.barrier()  # without it a rank can abort at exit while its peer still ends the last all-reduce
    del model, optimizer, loss  # before the group: freed after it, it can deadlock (docs/scripts.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13 can still abort a rank in interpreter finalization ("terminate called without an
    # active exception", docs/scripts.md); this script tests trainflow, not that, so it skips it
    sys.stdout.flush()
    os._exit(0)
