"""Drills only: a rank stands still after a step until the drill's fault is in, so the fault lands
at that step however fast the steps are. Heartbeats go on meanwhile; after FAULT_GATE_LIMIT_S the
rank goes on."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from trainflow.worker_config import EXCEPTION_SIGNAL, gate_arrival_path, gate_signal_path

FAULT_GATE_LIMIT_S = 120.0


def raise_on_drill_signal(rank: int, step: Callable[[], int]) -> None:
    """In a drill's attempt: EXCEPTION_SIGNAL makes this rank raise a DistNetworkError wherever its
    main thread is (a collective in progress finishes first)."""
    import torch.distributed as dist

    def raise_error(signum, frame) -> None:
        raise dist.DistNetworkError(f"drill: a network error injected into rank {rank} at step {step()}")

    signal.signal(EXCEPTION_SIGNAL, raise_error)


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
