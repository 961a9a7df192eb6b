"""Test workload: trains steadily (a pause after each step), rank 0 writing the step it reached to
--progress, and logs a metric under a --metric-name MLflow may refuse. From --hold-at-step every rank
waits until the file --release exists, so a test can keep training running through what it does to
the tracking store."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from tiny_ddp import train

RELEASE_DEADLINE_S = 600  # a test that never releases the job must not leave it running


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--progress", type=Path, required=True)
    parser.add_argument("--step-pause-s", type=float, default=0.05)
    parser.add_argument("--metric-name", default="")
    parser.add_argument("--hold-at-step", type=int, default=-1)
    parser.add_argument("--release", type=Path)
    args = parser.parse_args()

    def after_step(run, model, step: int) -> None:
        if args.metric_name:
            run.log(**{args.metric_name: float(step)})
        if run.rank == 0:  # whole or not at all: the test reads it while training goes on
            written = args.progress.with_name(f".{args.progress.name}.tmp")
            written.write_text(str(step))
            os.replace(written, args.progress)
        time.sleep(args.step_pause_s)
        if step == args.hold_at_step:
            deadline = time.monotonic() + RELEASE_DEADLINE_S
            while not args.release.exists() and time.monotonic() < deadline:
                time.sleep(0.1)

    train(after_step)


if __name__ == "__main__":
    main()
