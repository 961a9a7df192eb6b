"""Drills only: a rank stands still after a step until the drill's fault is in, so the fault lands
at that step however fast the steps are. Heartbeats go on meanwhile; after FAULT_GATE_LIMIT_S the
rank goes on."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trainflow.worker_config import gate_arrival_path, gate_signal_path

FAULT_GATE_LIMIT_S = 120.0


def wait_for_fault(gate: Path, rank: int, step: int, signalled: Callable[[], bool] = lambda: False) -> None:
    # the drill injects only once every rank is here: a rank reports a checkpoint step before
    # that step's save waits for the previous one, so a reported step alone says nothing of it
    gate_arrival_path(gate, rank).write_text(str(step))
    noted = False
    deadline = time.monotonic() + FAULT_GATE_LIMIT_S
    while not gate.exists() and time.monotonic() < deadline:
        if not noted and signalled():
            gate_signal_path(gate, rank).write_text(str(step))  # a preemption's SIGTERM is here
            noted = True
        time.sleep(0.005)
