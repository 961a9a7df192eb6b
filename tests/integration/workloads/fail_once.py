"""Test workload: trains like any other, but the first time rank 1 reaches --fail-at-step it exits
with code 3 (a marker file remembers that it did), so a run fails over once and then finishes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import trainflow.runtime as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-at-step", type=int, required=True)
    parser.add_argument("--marker", type=Path, required=True)
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
        if step == args.fail_at_step and run.rank == 1 and not args.marker.exists():
            args.marker.touch()
            print(f"failing once at step {step}", flush=True)
            sys.exit(3)
    run.finish()


if __name__ == "__main__":
    main()
