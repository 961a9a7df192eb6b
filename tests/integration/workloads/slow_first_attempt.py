"""Test workload: the first attempt's steps are slow (it is still training when a time limit's
warning comes), later attempts train at full speed, so a resumed run finishes well within the limit."""

from __future__ import annotations

import argparse
import time

from tiny_ddp import train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--first-attempt-step-s", type=float, required=True)
    args = parser.parse_args()

    def after_step(run, model, step: int) -> None:
        if run.config.attempt == 1:
            time.sleep(args.first_attempt_step_s)

    train(after_step)


if __name__ == "__main__":
    main()
