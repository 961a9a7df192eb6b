"""A rank's in-memory copies (runtime/memory_copy.py): what an in-process restart goes back to."""

from __future__ import annotations

import random

import numpy as np
import torch

from trainflow.runtime.memory_copy import MemoryCopies, every_steps
from trainflow.runtime.state_io import Stateful


class Position:
    """An extra, as a data loader's position is one."""

    def __init__(self) -> None:
        self.index = 0

    def state_dict(self) -> dict:
        return {"index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.index = state["index"]


def live() -> Stateful:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    return Stateful(model, torch.optim.Adam(model.parameters(), lr=0.01), {"data": Position()})


def train(state: Stateful, steps: int) -> None:
    for _ in range(steps):
        random.random(), np.random.rand()  # every RNG is drawn from, as a data pipeline would
        loss = state.model(torch.rand(8, 6)).pow(2).mean()
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.extras["data"].index += 8


def snapshot(state: Stateful) -> dict:
    optimizer = state.optimizer.state_dict()["state"]
    return {
        "params": [p.detach().clone() for p in state.model.parameters()],
        "moments": [s["exp_avg"].clone() for s in optimizer.values()],
        "steps": [float(s["step"]) for s in optimizer.values()],
        "index": state.extras["data"].index,
        "next": (torch.rand(3), random.random(), float(np.random.rand())),
    }


def test_a_copy_goes_back_into_new_objects_exactly_with_its_rng_and_extras():
    state = live()
    train(state, 3)
    copies = MemoryCopies()
    copies.take(3, state)
    expected = snapshot(state)  # also draws from every RNG: the copy must give back the draws before it
    train(state, 2)
    copies.take(5, state)
    train(state, 1)  # the failed step
    assert copies.steps == [3, 5]

    fresh = live()  # the script's objects, built again
    copies.restore(3, fresh)
    got = snapshot(fresh)
    assert all(torch.equal(a, b) for a, b in zip(got["params"], expected["params"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(got["moments"], expected["moments"], strict=True))
    assert got["steps"] == expected["steps"] == [3.0] * 4
    assert got["index"] == expected["index"] == 24
    assert torch.equal(got["next"][0], expected["next"][0]) and got["next"][1:] == expected["next"][1:]
    assert copies.steps == [3]  # the newer copy is of no use once training goes on from this one


def test_the_oldest_copys_buffers_are_used_again():
    state = live()
    copies = MemoryCopies()
    for step in (1, 2):
        train(state, 1)
        copies.take(step, state)
    oldest = copies._copies[0].tensors
    train(state, 1)
    copies.take(3, state)
    assert copies.steps == [2, 3] and copies._copies[1].tensors is oldest
    assert torch.equal(oldest["model.0.weight"], state.model[0].weight)


def test_copies_are_as_frequent_as_two_percent_of_the_step_time_allows():
    assert every_steps(copy_s=0.0001, step_s=0.1) == 1
    assert every_steps(copy_s=0.001, step_s=0.01) == 5
    assert every_steps(copy_s=0.0, step_s=0.0) == 1


def test_copies_in_a_shared_folder_are_taken_over_by_a_process_started_in_place(tmp_path):
    state = live()
    train(state, 3)
    copies = MemoryCopies(tmp_path)
    copies.take(3, state)
    expected = snapshot(state)
    train(state, 2)
    copies.take(5, state)
    train(state, 1)

    left = MemoryCopies.left_in(tmp_path)  # what the files say, as a new process reads them
    assert left.steps == [3, 5]
    fresh = live()
    left.restore(3, fresh)
    got = snapshot(fresh)
    assert all(torch.equal(a, b) for a, b in zip(got["params"], expected["params"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(got["moments"], expected["moments"], strict=True))
    assert got["index"] == expected["index"] == 24
    assert torch.equal(got["next"][0], expected["next"][0]) and got["next"][1:] == expected["next"][1:]
    assert MemoryCopies.left_in(tmp_path).steps == [3]  # the newer one is forgotten in the files too


def test_a_copy_cut_short_leaves_the_other_slot_whole(tmp_path):
    state = live()
    copies = MemoryCopies(tmp_path)
    for step in (1, 2):
        train(state, 1)
        copies.take(step, state)
    copies._forget(copies._copies[0].slot)  # where a death mid-copy leaves step 1's slot: undescribed
    assert MemoryCopies.left_in(tmp_path).steps == [2]


def test_a_full_shared_folder_keeps_the_copies_in_the_process(tmp_path, capsys):
    state = live()
    train(state, 1)
    copies = MemoryCopies(tmp_path / "gone")  # cannot be written
    copies.take(1, state)
    assert copies.steps == [1] and copies.folder is None
    assert "in this process only" in capsys.readouterr().err
