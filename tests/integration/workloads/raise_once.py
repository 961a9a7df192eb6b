"""Test workload: trains like any other, but the first time rank --rank reaches each --raise-at-step
it raises --error, or dies by that signal where --error names one (a marker file per step remembers
that it did). Each time the script starts in a rank's
process it adds that process's pid to --pids/rank-R, so a test tells a rank that went on in its
own process from one started anew."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch.distributed as dist
from tiny_ddp import train

ERRORS = {"DistNetworkError": dist.DistNetworkError, "ValueError": ValueError}
SIGNALS = {"SIGSEGV": signal.SIGSEGV, "SIGKILL": signal.SIGKILL}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--raise-at-step", type=int, action="append", required=True)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--error", choices=sorted(ERRORS) + sorted(SIGNALS), default="DistNetworkError")
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument("--pids", type=Path, required=True)
    args = parser.parse_args()
    args.pids.mkdir(parents=True, exist_ok=True)
    with (args.pids / f"rank-{os.environ['RANK']}").open("a") as record:
        record.write(f"{os.getpid()}\n")

    def after_step(run, model, step: int) -> None:
        marker = args.marker.with_name(f"{args.marker.name}-{step}")
        if step in args.raise_at_step and run.rank == args.rank and not marker.exists():
            marker.touch()
            if args.error in SIGNALS:
                if SIGNALS[args.error] != signal.SIGKILL:  # no handler's dump: a plain death
                    signal.signal(SIGNALS[args.error], signal.SIG_DFL)
                os.kill(os.getpid(), SIGNALS[args.error])
            raise ERRORS[args.error](f"injected at step {step}")

    train(after_step)


if __name__ == "__main__":
    main()
