"""Test workload: trains like any other, then one rank exits with a code at a given step."""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import trainflow.runtime as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit-at-step", type=int, required=True)
    parser.add_argument("--exit-rank", type=int, default=1)
    parser.add_argument("--exit-code", type=int, default=3)
    args = parser.parse_args()

    run = tf.init()
    torch.manual_seed(run.seed)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = run.restore(model=model, optimizer=optimizer)
    for step in run.steps(start):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log(loss=loss.item())
        if step == args.exit_at_step and run.rank == args.exit_rank:
            print(f"exiting with {args.exit_code} at step {step} (pid {os.getpid()})", flush=True)
            sys.exit(args.exit_code)
    run.finish()


if __name__ == "__main__":
    main()
