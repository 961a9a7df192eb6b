"""A rank on its way out is gone within EXIT_DEADLINE_S, whatever its interpreter's exit does.

A rank that has decided to exit (an error nobody caught, a preemption's checkpoint committed) has
closed its status reporter, the one thing that would end it if it stopped answering. Its exit can
still hang: a gloo group freed at the interpreter's exit may join a worker thread that waits for the
GIL the exiting thread holds (see leave_groups.py), and a rank whose agent is gone would then live
for good. faulthandler's watchdog is a C thread that needs no GIL: at the deadline it writes every
thread's stack to stderr and exits with 1, as an uncaught error does."""

from __future__ import annotations

import faulthandler
import io
import sys

EXIT_DEADLINE_S = 60.0


def end_within(seconds: float = EXIT_DEADLINE_S) -> None:
    """Arm the watchdog; a stderr without a file descriptor (captured output) leaves it unarmed."""
    stream = sys.__stderr__ or sys.stderr
    try:
        faulthandler.dump_traceback_later(seconds, exit=True, file=stream)
    except (AttributeError, ValueError, io.UnsupportedOperation, RuntimeError):
        pass
