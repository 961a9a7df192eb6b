"""Processes that end when the orchestrator that started them ends, however it ends (SIGKILL too).

A torchrun agent outlives a killed orchestrator: its workers stop once the status channel has been
unreachable for a while, but the agent can then wait out its exit barrier for minutes. Started
with the kernel's parent-death signal, the agent gets SIGTERM the moment the orchestrator is gone
and ends its workers (which save an emergency checkpoint) the way it does on any SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def ends_with_this_process(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that arms the signal in the child, or None where it cannot be used: off
    Linux, and off the main thread (the kernel signals when the starting *thread* ends)."""
    if _LIBC is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()
    prctl = _LIBC.prctl  # looked up here: the child after fork should only call it

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the orchestrator died before the signal was armed
            os.kill(os.getpid(), signum)

    return arm
