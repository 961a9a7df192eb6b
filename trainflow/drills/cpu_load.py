"""A CPU hog beside a job, as other work on a shared host: one busy loop per core, started and
always stopped by whoever runs it, with a record of what ran and that nothing was left."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, Field

BUSY_LOOP = "while True: pass"


class CpuLoad(BaseModel):
    """What the hog was, for the report; load averages (1, 5, 15 min) as it started and stopped."""

    processes: int = Field(description="Busy-loop processes, one per core.")
    niceness: int = Field(description="Their nice value (0: as eager for the CPU as the job itself).")
    pids: list[int] = Field(default_factory=list)
    load_before: tuple[float, float, float] | None = None
    load_after: tuple[float, float, float] | None = None


@contextmanager
def cpu_load(processes: int | None, niceness: int = 0) -> Iterator[CpuLoad | None]:
    """`processes` busy loops (None: no load) for as long as the block runs; killed and reaped however it ends."""
    if not processes:
        yield None
        return
    record = CpuLoad(processes=processes, niceness=niceness, load_before=os.getloadavg())
    hogs: list[subprocess.Popen] = []
    try:
        for _ in range(processes):
            hogs.append(
                subprocess.Popen(
                    [sys.executable, "-c", BUSY_LOOP],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=(lambda: os.nice(niceness)) if niceness else None,
                )
            )
        record.pids = [hog.pid for hog in hogs]
        yield record
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
        record.load_after = os.getloadavg()
