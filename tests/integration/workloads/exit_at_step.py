"""Test workload: trains like any other, then one rank exits with a code at a given step."""

from __future__ import annotations

import argparse
import os
import sys

from tiny_ddp import train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit-at-step", type=int, required=True)
    parser.add_argument("--exit-rank", type=int, default=1)
    parser.add_argument("--exit-code", type=int, default=3)
    args = parser.parse_args()

    def after_step(run, model, step: int) -> None:
        if step == args.exit_at_step and run.rank == args.exit_rank:
            print(f"exiting with {args.exit_code} at step {step} (pid {os.getpid()})", flush=True)
            sys.exit(args.exit_code)

    train(after_step)


if __name__ == "__main__":
    main()
