"""Test workload: reads a secret from its environment and writes only its sha256, pauses at a step
until released (so a test can look at the running job), then exits 0 without run.finish()."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

from tiny_ddp import train

RELEASE_DEADLINE_S = 600  # a test that never releases the job must not leave it running


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--secret-name", required=True)
    parser.add_argument("--pause-at-step", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True, help="where to write what this rank saw, and the release")
    args = parser.parse_args()

    def after_step(run, model, step: int) -> None:
        if step != args.pause_at_step:
            return
        secret = os.environ.get(args.secret_name, "")
        (args.dir / f"rank-{run.rank}.sha256").write_text(hashlib.sha256(secret.encode()).hexdigest())
        (args.dir / f"paused-{run.rank}").touch()
        deadline = time.monotonic() + RELEASE_DEADLINE_S
        while not (args.dir / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        sys.exit(0)  # without run.finish(): this attempt never finished

    train(after_step)


if __name__ == "__main__":
    main()
