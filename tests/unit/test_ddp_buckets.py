"""A restart rebuilds DDP; with four real gloo ranks the resumed training must still end
bit-identical to an uninterrupted one, and keep DDP's own bucket layout, whose all-reduce starts
with the last layers (trainflow.runtime.ddp_buckets)."""

from __future__ import annotations

import copy
import gc
import hashlib
import itertools
import json

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.spawned_ranks import free_port, run_ranks
from trainflow.runtime.ddp_buckets import BucketOrder, reducer_parameters

WORLD = 4
STEPS = 12
RESTART_AT = 6
BUCKET_CAPS_MB = (None, 0.03)  # DDP's default (one bucket for this model), and several buckets


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def _wrap(
    state: tuple[dict, dict] | None, bucket_cap_mb: float | None
) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    module = _net()
    if state is not None:
        module.load_state_dict(state[0])
    model = DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if state is not None:
        optimizer.load_state_dict(state[1])
    return model, optimizer


def _train(rank: int, port: int, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    generator = torch.Generator().manual_seed(100 + rank)
    batches = [
        (torch.randn(16, 64, generator=generator), torch.randint(0, 10, (16,), generator=generator))
        for _ in range(STEPS)
    ]
    # (name, trainflow's BucketOrder, restart at RESTART_AT, replay the order into the new DDP)
    runs = [
        ("uninterrupted", True, False, False),
        ("restarted", True, True, True),
        ("restarted without the order", True, True, False),
        ("plain", False, False, False),
    ]
    for (name, ordered, restart, replay), cap in itertools.product(runs, BUCKET_CAPS_MB):
        name = f"{name} {cap}"
        model, optimizer = _wrap(None, cap)
        order = BucketOrder(model) if ordered else None
        for step, (x, y) in enumerate(batches):
            if restart and step == RESTART_AT:  # what a restore does: a new DDP around the saved state
                saved = (copy.deepcopy(model.module.state_dict()), copy.deepcopy(optimizer.state_dict()))
                checkpointed = json.loads(json.dumps(order.state_dict()))
                model, optimizer = _wrap(saved, cap)
                order = BucketOrder(model)
                if replay:
                    order.load_state_dict(checkpointed)
                    assert order.apply()
                    assert all(p.grad is None for p in model.parameters()), "the replay leaves no gradient"
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if order is not None:
                order.stop_recording()
        params = [p.detach().clone() for p in model.module.parameters()]
        results[(name, rank)] = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
    # torch 2.13's gloo can deadlock when a DDP outlives its process group (docs/scripts.md)
    del model, optimizer, order
    gc.collect()
    dist.destroy_process_group()


def test_a_ddp_rebuilt_mid_training_on_four_ranks_ends_bit_identical():
    results = run_ranks(_train, (free_port(),), WORLD)

    def run(name: str, cap) -> set[str]:
        return {results[(f"{name} {cap}", r)] for r in range(WORLD)}

    for cap in BUCKET_CAPS_MB:
        assert len(run("uninterrupted", cap)) == 1, "every replica holds the same parameters"
        assert run("restarted", cap) == run("uninterrupted", cap), f"bucket_cap_mb={cap}"
        # a fresh run is DDP's own training, to the bit: the recording changes nothing
        assert run("plain", cap) == run("uninterrupted", cap), f"bucket_cap_mb={cap}"
    # the case the replay is for: a new DDP's first step reduced in one bucket, the others did not
    assert run("restarted without the order", 0.03) != run("uninterrupted", 0.03)


# ---- the layout itself, on one process ---------------------------------------------------------


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _layer_net() -> nn.Module:
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])


def _buckets_of_one_step(model: DistributedDataParallel) -> list[list[int]]:
    """The buckets one backward reduces, in the order they are reduced: each as its parameters'
    indices in the reducer."""
    index = {id(p): i for i, p in enumerate(reducer_parameters(model))}
    seen: list[list[int]] = []

    def hook(_state, bucket):
        seen.append([index[id(p)] for p in bucket.parameters()])
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    model.register_comm_hook(None, hook)
    model(torch.randn(4, 64)).sum().backward()
    return seen


def test_a_restored_ddp_reduces_from_its_first_step_with_the_layout_ddp_chose_last_layers_first(one_rank):
    torch.manual_seed(0)
    plain = DistributedDataParallel(_layer_net(), bucket_cap_mb=0.02)
    order = BucketOrder(plain)
    for _ in range(2):  # DDP rebuilds its buckets after the first backward
        plain(torch.randn(4, 64)).sum().backward()
        order.stop_recording()
    assert not order.recording and order.order[:2] == [11, 10], order.order  # the last layer's bias first
    own_layout = _buckets_of_one_step(plain)
    assert len(own_layout) > 2 and own_layout[0][0] == 11, own_layout

    restored = DistributedDataParallel(_layer_net(), bucket_cap_mb=0.02)
    replay = BucketOrder(restored)
    replay.load_state_dict(json.loads(json.dumps(order.state_dict())))
    assert replay.apply()
    assert _buckets_of_one_step(restored) == own_layout
    assert replay.state_dict() == order.state_dict(), "the next checkpoint keeps the order"


@pytest.mark.parametrize("tampered", [[0, 1], list(range(11)) + [11, 11], ["0"] * 12, "reversed", None])
def test_an_order_that_does_not_fit_the_model_is_not_replayed(one_rank, tampered, capsys):
    model = DistributedDataParallel(_layer_net(), bucket_cap_mb=0.02)
    order = BucketOrder(model)
    order.load_state_dict({"order": tampered})
    assert not order.apply()
    assert order.recording, "the new DDP's own order is recorded instead"
    assert ("does not fit" in capsys.readouterr().err) is (tampered is not None)
    assert len(_buckets_of_one_step(model)) == 1, "DDP's own first iteration: one bucket"


def test_what_needs_no_order_is_left_alone(one_rank):
    assert not BucketOrder(_layer_net()).recording  # not DDP
    unused = DistributedDataParallel(_layer_net(), find_unused_parameters=True)
    assert not BucketOrder(unused).recording  # never rebuilds its buckets


def test_the_parameters_are_the_reducers_in_its_order(one_rank):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 8)
            self.frozen = nn.Linear(8, 8)
            self.frozen.requires_grad_(False)
            self.body = nn.Linear(8, 8)
            self.skipped = nn.Linear(8, 8)
            self.head = nn.Linear(8, 10, bias=False)
            self.head.weight = self.embed.weight  # shared: the reducer holds it once

    module = Tied()
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, ["skipped.weight"])
    model = DistributedDataParallel(module)
    ours = reducer_parameters(model)
    assert [id(p) for p in ours] == [id(p) for p in model._build_params_for_reducer()[0]]
    held = {id(p) for p in ours}
    assert id(module.skipped.bias) in held and id(module.skipped.weight) not in held
    assert id(module.frozen.weight) not in held and len(ours) == 4  # embed (= head), body x 2, skipped.bias
