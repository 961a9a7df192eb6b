"""Test workload: in the first attempt, one replica's parameters are silently changed at a step
(as a flipped bit would), so the replicas diverge; later attempts train normally."""

from __future__ import annotations

import argparse

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import trainflow.runtime as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--at-step", type=int, required=True)
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
        if step == args.at_step and run.rank == 1 and run.config.attempt == 1:
            with torch.no_grad():
                model.module.bias.add_(1e-3)
    run.finish()


if __name__ == "__main__":
    main()
