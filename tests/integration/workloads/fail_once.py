"""Test workload: trains like any other, but the first time rank 1 reaches --fail-at-step it exits
with code 3 (a marker file remembers that it did), so a run fails over once and then finishes.
With --say, it writes that line to its stderr first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tiny_ddp import train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-at-step", type=int, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument("--say", default=None)
    args = parser.parse_args()

    def after_step(run, model, step: int) -> None:
        if step == args.fail_at_step and run.rank == 1 and not args.marker.exists():
            args.marker.touch()
            print(f"failing once at step {step}", flush=True)
            if args.say:
                print(args.say, file=sys.stderr, flush=True)
            sys.exit(3)

    train(after_step)


if __name__ == "__main__":
    main()
