"""A DataLoader over a DistributedSampler that resumes exactly mid-epoch.

Register it with `run.restore(..., data=loader)` and iterate with `run.batches(loader, start)`.
Its state is two numbers, the epoch and the batches already taken from it; after a restore the
epoch's order is rebuilt (DistributedSampler, seeded with seed and set_epoch) and the taken
batches are skipped without being loaded.

Two things make the resumed run the same as an uninterrupted one:
- the loader never draws from the global RNG: DataLoader seeds its workers from `generator`, here
  one seeded with seed + epoch, where a plain DataLoader draws that seed from the global RNG each
  time an iterator is created, and so shifts every later dropout mask of a resumed run;
- randomness in the dataset (augmentation in __getitem__) is seeded per sample, from (seed, epoch,
  position in the epoch), in whichever worker loads it, so it does not depend on which worker
  loaded what before the restart, nor on num_workers.

torchdata's StatefulDataLoader (0.11.0 installs beside torch 2.13 and its state is JSON) also
resumes the sample order and can be registered the same way, but only with a `generator` and a
dataset without randomness: after a restore its workers' random streams start over, so random
transforms differ from the uninterrupted run.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, get_worker_info


class _SeededSamples(Dataset):
    """The wrapped dataset, read by (position, index): each sample's RNG is seeded from its position."""

    def __init__(self, dataset: Dataset, base_seed: int):
        self.dataset = dataset
        self.base_seed = base_seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        position, index = key
        seed = (self.base_seed * 1_000_003 + position) % 2**63
        if get_worker_info() is not None:  # a worker process: its RNG is its own
            _seed_all(seed)
            return self.dataset[index]
        # num_workers=0 loads in the training process: leave its RNG as training left it
        saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
        try:
            _seed_all(seed)
            return self.dataset[index]
        finally:
            torch.set_rng_state(saved[0])
            random.setstate(saved[1])
            np.random.set_state(saved[2])


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


class _Positions(Sampler):
    def __init__(self, pairs: list[tuple[int, int]]):
        self.pairs = pairs

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)


class ResumableLoader:
    """Batches of this data-parallel rank's share of `dataset`, epoch after epoch, resumable.

    `num_replicas` and `rank` are the data-parallel degree and rank (`run.parallel.data`,
    `run.parallel.data_rank`): ranks of one tensor-parallel group read the same batches. Other
    keyword arguments (num_workers, collate_fn, pin_memory, ...) go to DataLoader."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        seed: int,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        drop_last: bool = True,
        **loader_kwargs: Any,
    ):
        for reserved in ("sampler", "batch_sampler", "shuffle", "generator", "worker_init_fn"):
            if reserved in loader_kwargs:
                raise TypeError(f"ResumableLoader: {reserved} is chosen by the loader (it decides what resumes)")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.sampler = DistributedSampler(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self.drop_last = drop_last
        self.loader_kwargs = loader_kwargs
        self.epoch = 0
        self.batch = 0  # batches of this epoch already handed out

    def __len__(self) -> int:
        """Batches per epoch."""
        per_rank = len(self.sampler)
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch; the next iteration starts the next epoch."""
        self.sampler.set_epoch(self.epoch)
        order = list(self.sampler)
        epoch_seed = self.seed * 10_007 + self.epoch
        pairs = [(position, index) for position, index in enumerate(order)][self.batch * self.batch_size :]
        loader = DataLoader(
            _SeededSamples(self.dataset, epoch_seed),
            batch_size=self.batch_size,
            sampler=_Positions(pairs),
            drop_last=self.drop_last,
            generator=torch.Generator().manual_seed(epoch_seed),
            **self.loader_kwargs,
        )
        for batch in loader:
            self.batch += 1
            yield batch
        self.epoch, self.batch = self.epoch + 1, 0

    def forever(self) -> Iterator[Any]:
        """Batches across epochs without end (the job's step count ends training)."""
        while True:
            empty = True
            for batch in self:
                empty = False
                yield batch
            if empty and self.batch == 0 and len(self) == 0:
                raise ValueError("ResumableLoader: the dataset has fewer samples than one batch per rank")

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


def epochs_of(loader: Iterable[Any]) -> Iterator[Any]:
    """A loader's batches epoch after epoch: a ResumableLoader's own, or any iterable's, again and again."""
    return loader.forever() if hasattr(loader, "forever") else _epochs(loader)


def _epochs(loader: Iterable[Any]) -> Iterator[Any]:
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the data loader has no batches for this rank")
