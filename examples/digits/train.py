"""Reference workload: a small data-parallel classifier on scikit-learn's bundled digits data.

Deterministic for a seed: the data order is a function of (seed, epoch) and every piece of state
(model, optimizer, data position, RNG) is checkpointed, so a resumed run ends bit-identical to an
uninterrupted one. Run it through trainflow, never directly:

    trainflow run examples/digits/spec.yaml
    trainflow run examples/digits/spec.yaml --set resources.nodes=1 --set resources.procs_per_node=2
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import trainflow.runtime as tf


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits (1797 8x8 images, the same arrays `load_digits()` returns), read
    straight from the file the package ships: importing sklearn costs seconds at every worker start,
    and a restart's recovery time is mostly start-up."""
    package = Path(importlib.util.find_spec("sklearn").origin).parent
    table = np.loadtxt(package / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


class DigitsNet(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class ShardedBatches:
    """This rank's slice of each global batch, in an order fixed by (seed, epoch)."""

    def __init__(
        self, features: torch.Tensor, labels: torch.Tensor, global_batch: int, rank: int, world: int, seed: int
    ):
        self.features, self.labels = features, labels
        self.global_batch, self.rank, self.world, self.seed = global_batch, rank, world, seed
        self.per_epoch = len(labels) // global_batch  # drop the ragged tail: every batch is full
        self.epoch, self.position = 0, 0
        self._order = self._shuffle()

    def _shuffle(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return torch.randperm(len(self.labels), generator=generator)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position == self.per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._shuffle()
        start = self.position * self.global_batch
        batch = self._order[start : start + self.global_batch][self.rank :: self.world]
        self.position += 1
        return self.features[batch], self.labels[batch]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffle()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.05)  # SGD learning rate
    parser.add_argument("--momentum", type=float, default=0.9)  # momentum buffers are checkpointed too
    parser.add_argument("--hidden", type=int, default=128)  # width of the two hidden layers
    parser.add_argument("--global-batch", type=int, default=64)  # samples per step across all ranks
    args = parser.parse_args()

    run = tf.init()
    images, targets = load_digits()
    features = torch.tensor(images, dtype=torch.float32) / 16.0
    labels = torch.tensor(targets, dtype=torch.long)
    batches = ShardedBatches(features, labels, args.global_batch, run.rank, run.world_size, run.seed)

    torch.manual_seed(run.seed)  # the same initial weights on every rank
    model = DDP(DigitsNet(args.hidden).to(run.device))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    start = run.restore(model=model, optimizer=optimizer, data=batches)
    for _ in run.steps(start, samples_per_step=args.global_batch):
        with run.waiting_for_data():
            x, y = batches.next()
        loss = F.cross_entropy(model(x.to(run.device)), y.to(run.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        run.log(loss=loss.item())
    run.finish()


if __name__ == "__main__":
    main()
