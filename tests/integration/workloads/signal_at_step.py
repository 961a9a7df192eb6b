"""Test workload: trains like any other, and the first time rank 0 reaches --at-step (a marker file
remembers that it did) it sends --signal to the process --pid (a test's server: SIGSTOP freezes it)."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from tiny_ddp import train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--signal", default="SIGSTOP")
    parser.add_argument("--at-step", type=int, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    args = parser.parse_args()

    def after_step(run, model, step: int) -> None:
        if step == args.at_step and run.rank == 0 and not args.marker.exists():
            args.marker.touch()
            os.kill(args.pid, signal.Signals[args.signal])
            print(f"sent {args.signal} to {args.pid} at step {step}", flush=True)

    train(after_step)


if __name__ == "__main__":
    main()
