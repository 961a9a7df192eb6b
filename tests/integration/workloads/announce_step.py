"""Test workload: trains like any other, and when rank 0 reaches --announce-at-step it writes that
step to --marker, so a test knows the run is training before it signals the orchestrator."""

from __future__ import annotations

import argparse
from pathlib import Path

from tiny_ddp import train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--announce-at-step", type=int, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    args = parser.parse_args()

    def after_step(run, model, step: int) -> None:
        if step == args.announce_at_step and run.rank == 0:
            args.marker.write_text(str(step))

    train(after_step)


if __name__ == "__main__":
    main()
