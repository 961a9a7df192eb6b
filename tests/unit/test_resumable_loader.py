"""ResumableLoader: a DistributedSampler loader that resumes exactly mid-epoch, with workers and
random transforms, without touching the global RNG."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from trainflow.runtime.data import ResumableLoader


class NoisyRange(Dataset):
    """Sample i is i plus noise drawn in __getitem__ (as a random augmentation would)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)]) + torch.rand(1)


def loader(rank: int = 0, workers: int = 0) -> ResumableLoader:
    return ResumableLoader(NoisyRange(), batch_size=3, seed=11, num_replicas=2, rank=rank, num_workers=workers)


def take(source: ResumableLoader, count: int) -> list[list[float]]:
    batches = source.forever()
    taken = [next(batches).flatten().tolist() for _ in range(count)]
    batches.close()
    return taken


@pytest.mark.parametrize("workers", [0, 2])
def test_resumes_mid_epoch_at_the_same_batches_and_noise(workers):
    uninterrupted = take(loader(workers=workers), 11)  # 4 batches per epoch: into the third epoch
    first = loader(workers=workers)
    assert take(first, 6) == uninterrupted[:6]
    state = first.state_dict()
    assert state == {"epoch": 1, "batch": 2}
    resumed = loader(workers=workers)
    resumed.load_state_dict(state)
    assert take(resumed, 5) == uninterrupted[6:]


def test_values_do_not_depend_on_the_number_of_workers():
    assert take(loader(workers=0), 6) == take(loader(workers=2), 6)


def test_each_epoch_shares_every_sample_out_between_ranks_in_a_new_order():
    def indices(batches: list[list[float]]) -> list[int]:
        return [int(v) for batch in batches for v in batch]

    mine, theirs = take(loader(rank=0), 8), take(loader(rank=1), 8)
    for epoch in (slice(0, 4), slice(4, 8)):
        assert sorted(indices(mine[epoch]) + indices(theirs[epoch])) == list(range(24))
    assert indices(mine[:4]) != indices(mine[4:])


def test_iterating_never_draws_from_the_global_rng():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    take(loader(workers=2), 6)
    resumed = loader()
    resumed.load_state_dict({"epoch": 1, "batch": 1})
    take(resumed, 3)
    assert torch.equal(before, torch.get_rng_state())


def test_reserved_arguments_are_refused_by_name():
    with pytest.raises(TypeError, match="generator"):
        ResumableLoader(NoisyRange(), 3, seed=1, num_replicas=1, rank=0, generator=torch.Generator())
