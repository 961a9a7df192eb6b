"""What every part of `make bench` shares: where things are, how a trainflow command's JSON line
is read, and how steps/s come from timestamps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def last_json(args: list[str], env: dict, timeout_s: float = 900) -> dict:
    result = subprocess.run(
        [str(BIN / "trainflow"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )
    lines = result.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"trainflow {' '.join(args[:2])} printed nothing:\n{result.stderr[-3000:]}")
    return json.loads(lines[-1])


def steps_per_s(points: list[tuple[int, float]], skip: int = 20) -> float:
    """Training steps per second from (step, unix time) pairs, after the first `skip` steps."""
    points = sorted(p for p in points if p[0] > skip)
    (first_step, first_t), (last_step, last_t) = points[0], points[-1]
    return (last_step - first_step) / (last_t - first_t)
