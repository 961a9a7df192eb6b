"""A plain torchrun script that checkpoints like nanoGPT: rank 0 saves a dict with torch.save to
OUT/ckpt.pt every few iterations, and `--init_from=resume` loads it (weights_only=True) and goes on
from its iteration. It never imports trainflow.runtime.

Each start appends (TRAINFLOW_ATTEMPT, the iteration it starts from) to the checkpoint's `starts`,
so the last checkpoint tells where every attempt began. Asked to, it fails once (`--fail-once
MARKER`: only while MARKER does not exist, which it then creates; or `--fail-in-attempt N`: in
trainflow's attempt N, where no file outlives a node, as in a pod) at an iteration, by exit code or
a signal, first waiting until its process is `--fail-not-before-s` old and, with
`--fail-once-copied-to URI`, until a copy of its checkpoint is committed there (so a retry has one
to resume from whatever the machine's load); `--remove-out` then deletes its folder, as a node
whose disk is lost.

    torchrun --nproc-per-node 2 plain_nanogpt.py --out_dir out --max_iters 60 --ckpt_every 10
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STARTED = time.time()


def committed_copy(uri: str) -> bool:
    from trainflow.checkpoint.storage import open_storage  # a test's helper; the training uses none of it

    return any(key.endswith("/manifest.json") for key in open_storage(uri).list())


def fail(args) -> None:
    while time.time() - STARTED < args.fail_not_before_s:
        time.sleep(0.05)
    deadline = time.time() + 120
    while args.fail_once_copied_to and not committed_copy(args.fail_once_copied_to) and time.time() < deadline:
        time.sleep(0.1)
    if args.fail_once:
        Path(args.fail_once).touch()
    if args.remove_out:
        shutil.rmtree(args.out_dir)
    print(f"failing at iteration {args.fail_at_iter}", file=sys.stderr, flush=True)
    if args.fail_signal:
        os.kill(os.getpid(), getattr(signal, args.fail_signal))
    os._exit(args.fail_code)


def failing_now(args) -> bool:
    if args.fail_in_attempt is not None:
        return os.environ.get("TRAINFLOW_ATTEMPT") == str(args.fail_in_attempt)
    return bool(args.fail_once) and not Path(args.fail_once).exists()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out_dir", default="out")
    parser.add_argument("--init_from", default="scratch", choices=["scratch", "resume"])
    parser.add_argument("--max_iters", type=int, default=60)
    parser.add_argument("--ckpt_every", type=int, default=10)
    parser.add_argument("--iter_sleep_s", type=float, default=0.0)
    parser.add_argument("--fail-once", default=None)
    parser.add_argument("--fail-in-attempt", type=int, default=None)
    parser.add_argument("--fail-at-iter", type=int, default=30)
    parser.add_argument("--fail-rank", type=int, default=0)
    parser.add_argument("--fail-code", type=int, default=1)
    parser.add_argument("--fail-signal", default=None)
    parser.add_argument("--fail-not-before-s", type=float, default=0.0)
    parser.add_argument("--fail-once-copied-to", default=None)
    parser.add_argument("--remove-out", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = Path(args.out_dir)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    iter_num, starts = 0, []
    if args.init_from == "resume":
        checkpoint = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num, starts = checkpoint["iter_num"], checkpoint["starts"]
    starts.append([int(os.environ.get("TRAINFLOW_ATTEMPT", "0")), iter_num])
    ddp = DDP(model)
    generator = torch.Generator().manual_seed(1000 + rank)
    while iter_num < args.max_iters:
        loss = ddp(torch.randn(4, 8, generator=generator)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        iter_num += 1
        if iter_num % args.ckpt_every == 0 and rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iter_num": iter_num,
                    "starts": starts,
                },
                out / "ckpt.pt",
            )
        if iter_num == args.fail_at_iter and rank == args.fail_rank and failing_now(args):
            fail(args)
        time.sleep(args.iter_sleep_s)
    print(f"rank {rank} done at iteration {iter_num}", flush=True)
    dist.barrier()  # without it a rank can abort at exit while its peer still ends the last all-reduce
    del ddp, model, optimizer, loss  # before the group: freed after it, it can deadlock (docs/scripts.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # past interpreter finalization: this script tests trainflow, not torch's exit (docs/scripts.md)
