"""Test workload: in the first attempt, one replica's parameters are silently changed at a step
(as a flipped bit would), so the replicas diverge; later attempts train normally."""

from __future__ import annotations

import argparse

import torch
from tiny_ddp import train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--at-step", type=int, required=True)
    args = parser.parse_args()

    def after_step(run, model, step: int) -> None:
        if step == args.at_step and run.rank == 1 and run.config.attempt == 1:
            with torch.no_grad():
                model.module.bias.add_(1e-3)

    train(after_step)


if __name__ == "__main__":
    main()
