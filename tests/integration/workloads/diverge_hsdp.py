"""Test workload: HSDP (replicated across 2 nodes, sharded within each) where, in the first
attempt, one replica's local shard is silently changed at a step; the shards within a node always
differ by design and must never count as divergence."""

from __future__ import annotations

import argparse

import torch
from torch.distributed.fsdp import fully_shard

import trainflow.runtime as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--at-step", type=int, required=True)
    args = parser.parse_args()

    run = tf.init()
    torch.manual_seed(run.seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    fully_shard(model, mesh=run.mesh["dp_replicate", "dp_shard"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = run.restore(model=model, optimizer=optimizer)
    for step in run.steps(start):
        generator = torch.Generator().manual_seed(step * 100 + run.parallel.data_rank)
        loss = model(torch.randn(4, 8, generator=generator)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log(loss=loss.item())
        if step == args.at_step and run.rank == 3 and run.config.attempt == 1:  # node 1's second shard
            with torch.no_grad():
                model[0].bias.to_local().add_(1e-3)
    run.finish()


if __name__ == "__main__":
    main()
