"""Test workload: trains like any other, but the first time rank 1 reaches --fail-at-step it exits
with code 3 (a marker file remembers that it did; or, with --in-attempt N instead, it fails in
trainflow's attempt N, where no file outlives a node, as in a pod), so a run fails over once and
then finishes.
With --say, it writes that line to its stderr first."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tiny_ddp import train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-at-step", type=int, required=True)
    failing = parser.add_mutually_exclusive_group(required=True)
    failing.add_argument("--marker", type=Path)
    failing.add_argument("--in-attempt", type=int)
    parser.add_argument("--say", default=None)
    args = parser.parse_args()

    def first_time() -> bool:
        if args.in_attempt is not None:
            return os.environ.get("TRAINFLOW_ATTEMPT") == str(args.in_attempt)
        return not args.marker.exists()

    def after_step(run, model, step: int) -> None:
        if step == args.fail_at_step and run.rank == 1 and first_time():
            if args.marker:
                args.marker.touch()
            print(f"failing once at step {step}", flush=True)
            if args.say:
                print(args.say, file=sys.stderr, flush=True)
            sys.exit(3)

    train(after_step)


if __name__ == "__main__":
    main()
