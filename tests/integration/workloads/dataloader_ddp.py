"""Test workload: an epoch-based DDP job fed by a DataLoader with a DistributedSampler (shuffled,
two worker processes, a random augmentation in the dataset) and dropout in the model, so an exact
resume needs the data position, the workers' randomness and the global RNG all restored.
With --stop-at-step N the first attempt commits a checkpoint at step N and every rank exits 3.
With --losses DIR every rank writes the loss it logged at the final step to DIR/rank-R.txt.
With --die-at-step N rank 1 dies there (os._exit, no cleanup) while rank 0's loader workers run."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

import trainflow.runtime as tf


class NoisyPoints(Dataset):
    def __init__(self, size: int):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 8, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index] + 0.01 * torch.randn(8), self.y[index]  # the augmentation draws in the worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-at-step", type=int, default=0)
    parser.add_argument("--losses", type=Path)
    parser.add_argument("--die-at-step", type=int, default=0)
    args = parser.parse_args()

    run = tf.init()
    loader = tf.ResumableLoader(
        NoisyPoints(48),
        batch_size=4,
        seed=run.seed,
        num_replicas=run.parallel.data,
        rank=run.parallel.data_rank,
        num_workers=2,
    )  # 6 batches per epoch
    torch.manual_seed(run.seed)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    start = run.restore(model=model, optimizer=optimizer, data=loader, scheduler=scheduler)
    epoch = loader.epoch  # the restored one
    for step, (x, y) in run.batches(loader, start):
        if loader.epoch != epoch:
            scheduler.step()  # an epoch-based schedule, stepped when the loader starts a new epoch
        epoch = loader.epoch
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log(loss=loss.item(), epoch=loader.epoch)
        if args.losses is not None and step == run.total_steps:
            (args.losses / f"rank-{run.rank}.txt").write_text(repr(loss.item()))
        if step == args.die_at_step and run.rank == 1:
            os._exit(1)
        if step == args.stop_at_step and run.config.attempt == 1:
            run.checkpoint()  # returns once committed: the retry resumes here, mid-epoch
            sys.exit(3)
    run.finish()


if __name__ == "__main__":
    main()
