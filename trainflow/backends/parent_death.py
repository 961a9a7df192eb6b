"""Processes that end when the orchestrator that started them ends, however it ends (SIGKILL too).

A torchrun agent outlives a killed orchestrator: its workers stop once the status channel has been
unreachable for a while, but the agent can then wait out its exit barrier for minutes. Started
with the kernel's parent-death signal, the agent gets SIGTERM the moment the orchestrator is gone
and ends its workers (which save an emergency checkpoint) the way it does on any SIGTERM.

The signal is armed by this file run as a wrapper that then becomes the command (exec keeps the
pid and the armed signal), not by a `preexec_fn`: with one, Popen runs Python's at-fork callbacks,
and a Ctrl-C arriving in one of them is swallowed, so the run would not stop.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1


def ending_with_this_process(command: list[str]) -> list[str]:
    """`command`, wrapped to get SIGTERM when this process ends; unchanged off Linux and off the main
    thread (the kernel signals when the starting *thread* ends)."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return command
    # -S: no site-packages, the wrapper needs only the standard library and starts in milliseconds
    return [sys.executable, "-S", str(Path(__file__).resolve()), str(os.getpid()), *command]


def _exec_ending_with(parent: int, command: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the orchestrator died before the signal was armed
        sys.exit(1)
    os.execvp(command[0], command)


if __name__ == "__main__":
    _exec_ending_with(int(sys.argv[1]), sys.argv[2:])
