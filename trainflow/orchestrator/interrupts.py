"""Signals that stop a run: which one it was, steps they must not cut in half, and finishing
teardown when another comes.

Ctrl-C and SIGTERM stop the flow wherever it is; the flow's teardown then ends the attempt (with an
emergency checkpoint), frees its resources and closes its MLflow runs. A second Ctrl-C, pressed
while that happens, would cut teardown short and leave exactly what it is there to remove, so the
first signal that arrives during teardown is only reported; a further one acts as usual.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Let the block finish before SIGINT or SIGTERM act: one that arrives meanwhile is delivered
    again, to its usual handler, right after the block (for steps that must not be cut in half,
    like creating the tables of a new MLflow store)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: arrived.append(signum)) for signum in HELD}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for held in arrived[:1]:
        signal.raise_signal(held)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@contextmanager
def teardown_not_interrupted() -> Iterator[None]:
    """Run the block (teardown) through the first SIGINT or SIGTERM that arrives meanwhile."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in HELD}

    def hold(signum, frame):
        print(
            f"trainflow: {signal_name(signum)} received while tearing down; finishing teardown first "
            "(send it again to stop now)",
            file=sys.stderr,
            flush=True,
        )
        for held, handler in previous.items():
            signal.signal(held, handler)

    for signum in HELD:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
