"""trainflow.runtime.state: tensors split from JSON state, RNG capture, parameter hashing."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from trainflow.runtime.state import (
    capture_rng,
    join_tensors,
    params_sha256,
    restore_rng,
    split_tensors,
)


def test_split_and_join_round_trip():
    weight, bias, moment = torch.randn(3, 2), torch.zeros(2), torch.tensor(1.5)
    tree = {
        "model": {"weight": weight, "bias": bias},
        "optimizer": {"state": [{"exp_avg": moment, "step": 7}], "lr": 0.05, "betas": [0.9, 0.999]},
        "data": {"epoch": 2, "cursor": None, "shuffle": True, "name": "digits"},
    }
    tensors, plain = split_tensors(tree)
    assert set(tensors) == {"model.weight", "model.bias", "optimizer.state.0.exp_avg"}
    assert tensors["model.weight"] is weight
    json.dumps(plain)  # the rest is plain JSON
    back = join_tensors(json.loads(json.dumps(plain)), tensors)
    assert torch.equal(back["model"]["weight"], weight)
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], moment)
    assert back["optimizer"]["lr"] == 0.05 and back["optimizer"]["betas"] == [0.9, 0.999]
    assert back["data"] == tree["data"]


def test_split_with_prefix():
    tensors, plain = split_tensors({"w": torch.ones(1)}, prefix="model")
    assert list(tensors) == ["model.w"]
    assert plain == {"w": {"__tensor__": "model.w"}}


def test_int_keys_come_back_when_asked():
    tensors, plain = split_tensors({"state": {0: {"m": torch.ones(1)}, -1: 2.0}})
    assert set(plain["state"]) == {"0", "-1"}  # JSON keys are strings
    back = join_tensors(plain, tensors, int_keys=True)
    assert set(back["state"]) == {0, -1}
    assert torch.equal(back["state"][0]["m"], torch.ones(1))
    assert set(join_tensors(plain, tensors)["state"]) == {"0", "-1"}


@pytest.mark.parametrize("bad", [{1, 2}, object(), b"bytes"])
def test_unsupported_value_names_its_path(bad):
    with pytest.raises(TypeError, match=r"^optimizer\.extra\.1: .* cannot be checkpointed"):
        split_tensors({"optimizer": {"extra": [1.0, bad]}})


def test_capture_and_restore_rng_repeat_the_same_draws():
    state = json.loads(json.dumps(capture_rng()))  # it is stored as JSON
    first = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(4), torch.rand(5)  # move every generator on
    restore_rng(state)
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == second[0]
    assert first[1] == second[1]
    assert torch.equal(first[2], second[2])


def test_restore_rng_after_gaussian_draws():
    random.gauss(0, 1)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's state
    state = capture_rng()
    first = (random.gauss(0, 1), np.random.standard_normal())
    restore_rng(state)
    assert (random.gauss(0, 1), np.random.standard_normal()) == first


def test_params_sha256_equal_for_equal_tensors():
    a = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(3)}
    b = {"w": torch.arange(6.0).reshape(2, 3).clone(), "b": torch.zeros(3)}
    assert params_sha256(a) == params_sha256(b)
    assert len(params_sha256(a)) == 64


def test_params_sha256_changes_with_one_element():
    a = {"w": torch.arange(6.0)}
    b = {"w": torch.arange(6.0)}
    b["w"][4] = 4.0001
    assert params_sha256(a) != params_sha256(b)


def test_params_sha256_ignores_insertion_order():
    w, b = torch.randn(4), torch.randn(2)
    assert params_sha256({"w": w, "b": b}) == params_sha256({"b": b, "w": w})


def test_params_sha256_depends_on_names_dtype_and_shape():
    base = params_sha256({"w": torch.zeros(4)})
    assert params_sha256({"v": torch.zeros(4)}) != base
    assert params_sha256({"w": torch.zeros(4, dtype=torch.float64)}) != base
    assert params_sha256({"w": torch.zeros(2, 2)}) != base


def test_params_sha256_zero_dim_and_empty_tensors():
    assert params_sha256({"s": torch.tensor(1.0)}) == params_sha256({"s": torch.tensor(1.0)})
    assert params_sha256({"s": torch.tensor(1.0)}) != params_sha256({"s": torch.tensor(2.0)})
    assert params_sha256({"e": torch.empty(0)})  # no data, still hashed


def test_params_sha256_of_non_contiguous_tensor_matches_its_copy():
    t = torch.arange(6.0).reshape(2, 3).t()
    assert params_sha256({"w": t}) == params_sha256({"w": t.contiguous()})


def test_params_sha256_of_tensor_requiring_grad():
    p = torch.nn.Parameter(torch.ones(3))
    assert params_sha256({"p": p}) == params_sha256({"p": torch.ones(3)})
