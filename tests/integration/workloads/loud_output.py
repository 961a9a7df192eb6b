"""A plain torchrun script that prints a lot: `--mib` MiB to stdout and to stderr per step, then
fails with its own last stderr line."""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--mib", type=float, default=1.0)
    args = parser.parse_args()
    rank = os.environ["RANK"]
    line = f"rank {rank} says " + "x" * 100 + "\n"
    per_step = max(1, int(args.mib * 2**20) // len(line))
    for step in range(args.steps):
        sys.stdout.write(line * per_step)
        sys.stdout.flush()
        sys.stderr.write(f"step {step}: " + line * per_step)
        sys.stderr.flush()
    sys.exit(f"loud_output.py: rank {rank} ran out of data after {args.steps} steps")


if __name__ == "__main__":
    main()
