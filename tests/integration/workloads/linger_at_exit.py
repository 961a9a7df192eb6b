"""A plain torchrun script whose rank 0 outlives its peers: it works on for a while after training
(`--linger S`, as a rank that saves the model does), or never exits at all (`--linger -1`: a thread
it started and forgot keeps the interpreter from ending, like a deadlock at exit)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {int(total.item())} ranks trained", flush=True)
    if rank == 0 and args.linger < 0:
        threading.Thread(target=threading.Event().wait, name="forgotten").start()
    elif rank == 0:
        time.sleep(args.linger)


if __name__ == "__main__":
    main()
    if threading.active_count() == 1:
        sys.stdout.flush()
        os._exit(
            0
        )  # past torch 2.13's gloo aborts at interpreter exit (docs/scripts.md); the forgotten thread is waited for
