"""`make bench`'s DDP bucket layout part: the steps/s of a DDP model of several buckets in the layout
trainflow gives a resumed run (the order its first backward recorded, replayed into the new DDP:
trainflow/runtime/ddp_buckets.py) against DDP's own layout, and against a layout in parameter
order, whose all-reduce can start only once the whole backward is done. Two ranks on gloo, the
three layouts in interleaved rounds within the same processes."""

from __future__ import annotations

import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainflow.runtime.ddp_buckets import BucketOrder

LAYERS, WIDTH, BATCH = 16, 1024, 32  # 16.8 M parameters: 67 MB of gradients, four of DDP's 25 MB buckets
WARMUP, STEPS, ROUNDS = 3, 20, 5
LAYOUTS = ("ddp", "trainflow", "parameter order")


def _model() -> DistributedDataParallel:
    torch.manual_seed(0)
    return DistributedDataParallel(
        nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(LAYERS)])
    )


def _recorded_order() -> dict:
    """What a checkpoint of the run keeps: the order of its first backward."""
    model = _model()
    order = BucketOrder(model)
    model(torch.randn(BATCH, WIDTH)).sum().backward()
    order.stop_recording()
    return json.loads(json.dumps(order.state_dict()))


def _in_layout(layout: str, checkpointed: dict) -> DistributedDataParallel:
    model = _model()
    if layout == "trainflow":
        restored = BucketOrder(model)
        restored.load_state_dict(checkpointed)
        assert restored.apply()
    elif layout == "parameter order":
        model.reducer._push_all_rebuilt_params()
    return model


def _steps_per_s(model: DistributedDataParallel) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(BATCH, WIDTH)
    for step in range(WARMUP + STEPS):
        if step == WARMUP:
            began = time.perf_counter()
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    return STEPS / (time.perf_counter() - began)


def _rank(rank: int, port: int, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    checkpointed = _recorded_order()
    rounds = {layout: [] for layout in LAYOUTS}
    for _ in range(ROUNDS):
        for layout in LAYOUTS:
            rounds[layout].append(_steps_per_s(_in_layout(layout, checkpointed)))
    if rank == 0:
        results.update(rounds)
    dist.destroy_process_group()


def ddp_layout() -> dict:
    measured_at, before = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(port, results), nprocs=2, join=True)
    rounds = {layout: [round(v, 3) for v in results[layout]] for layout in LAYOUTS}

    def ratio(layout: str) -> float:
        return statistics.median(ours / own for ours, own in zip(rounds[layout], rounds["ddp"]))

    return {
        "measured_at": measured_at,
        "load_before": before,
        "load_after": os.getloadavg(),
        "steps_per_s": {layout: statistics.median(v) for layout, v in rounds.items()},
        "trainflow_ratio": ratio("trainflow"),
        "parameter_order_ratio": ratio("parameter order"),
        "rounds": rounds,
    }


def markdown(part: dict) -> list[str]:
    steps = part["steps_per_s"]
    return [
        f"## DDP bucket layout of a resumed run ({LAYERS} x Linear({WIDTH}), 4 buckets, 2 ranks on gloo; "
        f"{ROUNDS} interleaved rounds)",
        "",
        f"Measured {part['measured_at']}; load before {part['load_before'][0]:.2f}.",
        "",
        "| layout | steps/s | ratio to DDP's own |",
        "|---|---|---|",
        f"| DDP's own (a fresh run) | {steps['ddp']:.2f} | 1 |",
        f"| trainflow's, resumed (the recorded order replayed) | {steps['trainflow']:.2f} | "
        f"{part['trainflow_ratio']:.3f} |",
        f"| parameter order (all-reduce after the whole backward) | {steps['parameter order']:.2f} | "
        f"{part['parameter_order_ratio']:.3f} |",
        "",
        "On this machine's CPU cores the layouts tie within the rounds' spread: the all-reduce runs on the same two "
        "cores as the backward, so there is nothing for it to overlap with. The layout matters where the backward "
        "runs on a GPU and the all-reduce on the network; what this part shows is that the replayed layout costs a "
        "resumed run nothing against DDP's own.",
        "",
    ]


if __name__ == "__main__":
    print(json.dumps(ddp_layout()))
