"""The digits classifier with its parameters sharded by FSDP2 (`fully_shard`) and its data fed by
a DataLoader over a DistributedSampler, epoch after epoch, resumable mid-epoch.

    trainflow run examples/fsdp/spec.yaml                                   # 2 nodes x 2 processes: dp 4
    trainflow run examples/fsdp/spec.yaml --set parallel.strategy=hybrid    # HSDP: replicate x shard

Everything needed for an exact resume is registered with run.restore: the model and optimizer
(sharded tensors, saved and resharded by DCP), the learning-rate schedule and the data loader's
position. CPU limits: gloo, no mixed precision (FSDP2's MixedPrecisionPolicy wants a GPU to pay off).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import TensorDataset

import trainflow.runtime as tf


def digits() -> TensorDataset:
    """scikit-learn's bundled digits (1797 8x8 images), read from the file the package ships."""
    package = Path(importlib.util.find_spec("sklearn").origin).parent
    table = np.loadtxt(package / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return TensorDataset(torch.tensor(table[:, :-1], dtype=torch.float32) / 16.0, torch.tensor(table[:, -1]).long())


def build(hidden: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)  # per data-parallel rank
    parser.add_argument("--workers", type=int, default=1)  # DataLoader worker processes per rank
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    run = tf.init()
    mesh = run.mesh["dp_replicate", "dp_shard"] if run.parallel.strategy == "hybrid" else run.mesh["dp"]
    torch.manual_seed(run.seed)  # the same initial weights on every rank, before sharding
    model = build(args.hidden)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.95)  # stepped once an epoch
    loader = tf.ResumableLoader(
        digits(),
        args.batch,
        seed=run.seed,
        num_replicas=run.parallel.data,
        rank=run.parallel.data_rank,
        num_workers=args.workers,
    )

    start = run.restore(model=model, optimizer=optimizer, schedule=schedule, data=loader)
    epoch = loader.epoch
    for _, (x, y) in run.batches(loader, start, samples_per_step=args.batch * run.parallel.data):
        if loader.epoch != epoch:
            schedule.step()
            epoch = loader.epoch
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        reported = loss.detach().clone()
        dist.all_reduce(reported)  # the global batch's loss
        run.log(loss=reported.item() / run.world_size, epoch=loader.epoch)
    run.finish()


if __name__ == "__main__":
    main()
