"""The test workloads' shared job: a one-layer DDP model trained through trainflow's runtime.
Each workload adds what goes wrong, in `after_step(run, model, step)`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import trainflow.runtime as tf


def train(after_step: Callable[[tf.Run, DDP, int], None]) -> None:
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
        after_step(run, model, step)
    run.finish()
