"""Test workload: trains like any other, and the first time rank 0 reaches --at-step (a marker file
remembers that it did), once the checkpoint of --after-commit is in the store, the checkpoint
folder fails: `--fault full` writes it full (ENOSPC), `--fault read-only` remounts it read-only
(the tests run as root). With --free-on-attempt N, rank 0 of attempt N removes the filler before
joining the job, so the store has room again from that attempt on."""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import time
from pathlib import Path

from tiny_ddp import train

from trainflow.worker_config import WorkerConfig

FILLER = "filler.bin"


def fill(folder: Path) -> None:
    with open(folder / FILLER, "ab") as handle:
        try:
            while True:
                handle.write(b"\0" * (64 << 10))
                handle.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    print(f"{folder} is full", flush=True)


def wait_for_commit(folder: Path, run_id: str, step: int) -> None:
    manifest = folder / run_id / f"step-{step:08d}" / "manifest.json"
    deadline = time.monotonic() + 120
    while not manifest.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{manifest} never appeared")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--fault", choices=["full", "read-only"], required=True)
    parser.add_argument("--at-step", type=int, required=True)
    parser.add_argument("--after-commit", type=int, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument("--free-on-attempt", type=int, default=0)
    args = parser.parse_args()

    config = WorkerConfig.from_env()
    if config.attempt == args.free_on_attempt and os.environ.get("RANK") == "0":
        (args.store / FILLER).unlink(missing_ok=True)  # before init: no rank saves before this

    def after_step(run, model, step: int) -> None:
        if step == args.at_step and run.rank == 0 and not args.marker.exists():
            args.marker.touch()
            wait_for_commit(args.store, run.config.run_id, args.after_commit)
            if args.fault == "full":
                fill(args.store)
            else:
                subprocess.run(["mount", "-o", "remount,ro", str(args.store)], check=True)
                print(f"{args.store} is read-only", flush=True)

    train(after_step)


if __name__ == "__main__":
    main()
