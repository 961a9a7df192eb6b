"""Test workload: trains like any other, but rank 0 of attempt 1 first deletes the run folder of the
checkpoint it was told to restore from, as another run's retention could have just before (the
checkpoint folder is a local one). Before joining the job: no rank restores before it is gone."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tiny_ddp import train

from trainflow.checkpoint.catalog import run_of
from trainflow.worker_config import WorkerConfig


def main() -> None:
    config = WorkerConfig.from_env()
    if config.attempt == 1 and os.environ.get("RANK") == "0" and config.restore_prefix:
        doomed = Path(config.checkpoint_uri) / run_of(config.restore_prefix)
        shutil.rmtree(doomed)
        print(f"deleted {doomed} before restoring from it", flush=True)
    train(lambda run, model, step: None)


if __name__ == "__main__":
    main()
