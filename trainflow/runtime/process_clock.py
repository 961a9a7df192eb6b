"""When this worker's interpreter started, on the wall clock: the start of a recovery's imports
phase (contracts/recovery.py). Two small reads of /proc, once per worker."""

from __future__ import annotations

import os
import time

_DAY_S = 86400.0


def process_started_at() -> float | None:
    """This process's start time (seconds since the epoch), from /proc on Linux; None where /proc
    cannot say (another OS, a time namespace that disagrees with the wall clock)."""
    try:
        with open("/proc/self/stat") as stat_file:
            stat = stat_file.read()
        with open("/proc/uptime") as uptime_file:
            uptime_s = float(uptime_file.read().split()[0])
        # after the parenthesised command name, fields count from 3; starttime is field 22
        start_ticks = int(stat.rpartition(")")[2].split()[19])
        ticks_per_s = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    now = time.time()
    started = now - uptime_s + start_ticks / ticks_per_s
    # a start in the future or days ago means the two clocks disagree here: say nothing
    return started if now - _DAY_S < started <= now + 0.05 else None
