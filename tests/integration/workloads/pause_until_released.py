"""Test workload: trains like any other, but at --pause-at-step every rank waits until the file
--release exists (rank 0 first writes --paused), so a test can hold a run at a known point and
then let it finish normally."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tiny_ddp import train

RELEASE_DEADLINE_S = 600  # a test that never releases the job must not leave it running


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pause-at-step", type=int, required=True)
    parser.add_argument("--paused", type=Path, required=True)
    parser.add_argument("--release", type=Path, required=True)
    args = parser.parse_args()

    def after_step(run, model, step: int) -> None:
        if step != args.pause_at_step:
            return
        if run.rank == 0:
            args.paused.write_text(str(step))
        deadline = time.monotonic() + RELEASE_DEADLINE_S
        while not args.release.exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    train(after_step)


if __name__ == "__main__":
    main()
