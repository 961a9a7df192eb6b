"""A throttled host, from outside: one rank's work on the CPU takes SLOWER times as long, its waits
for the other ranks do not.

The rank's training thread is watched through /proc: for every second of CPU it used it owes
SLOWER - 1 seconds frozen (SIGSTOP), paid while it is found on a CPU (or waiting for one). So the
slowing lands in the rank's own work, as much of it however late this watcher is woken. Freezing it
on a fixed duty cycle instead would, on a busy machine where every rank spends most of a step
waiting for its peers and for the scheduler, mostly land in its all-reduce and stretch every rank's
step alike: a slow network, not a straggler. Only where /proc cannot be read is the rank frozen on
that duty cycle.

The watcher is a process of its own (this file, run with `-S`): a thread of the orchestrator would
wait its turn for the interpreter lock behind the status channel and the flow, and on a busy machine
wake a hundred milliseconds late, leaving the rank to run unthrottled meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

SLOWER = 4.0
POLL_S = 0.001
SHORTEST_FREEZE_S = 0.002
LONGEST_FREEZE_S = 0.05
FROZEN_S, RUNNING_S = 0.015, 0.005  # the duty cycle where /proc cannot be read


def throttle_in_own_process(pid: int, duration_s: float, ended: Callable[[], bool]) -> int:
    """Throttle the process `pid` (of this machine) for `duration_s` seconds or until `ended()`,
    from a process of its own. Returns how many times it was frozen."""
    command = [sys.executable, "-S", str(Path(__file__).resolve()), str(pid), str(duration_s), str(os.getpid())]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as watcher:
        while watcher.poll() is None:
            if ended():
                watcher.terminate()  # it leaves the rank running
                break
            time.sleep(0.1)
        frozen = watcher.communicate()[0].strip()
    return int(frozen) if frozen.isdigit() else 0


def throttle(
    signal_rank: Callable[[signal.Signals], None], pid: int, duration_s: float, going: Callable[[], bool]
) -> int:
    """Throttle the process `pid` for `duration_s` seconds, or until `going()` is false or the
    process is gone; it is left running. Returns how many times it was frozen."""
    frozen = 0
    end = time.monotonic() + duration_s
    try:
        used, owed = cpu_s(pid), 0.0
        while time.monotonic() < end and going():
            time.sleep(POLL_S)
            now_used = cpu_s(pid)
            if used is None or now_used is None:
                pause_s, after_s = FROZEN_S, RUNNING_S
            else:
                owed = min(owed + (SLOWER - 1) * (now_used - used), 4 * LONGEST_FREEZE_S)
                used = now_used
                if owed < SHORTEST_FREEZE_S or not on_cpu(pid):
                    continue
                pause_s, after_s = min(owed, LONGEST_FREEZE_S), 0.0
                owed -= pause_s
            signal_rank(signal.SIGSTOP)
            frozen += 1
            time.sleep(pause_s)
            signal_rank(signal.SIGCONT)
            time.sleep(after_s)
    except ProcessLookupError:
        pass
    finally:
        try:
            signal_rank(signal.SIGCONT)
        except ProcessLookupError:
            pass
    return frozen


def cpu_s(pid: int) -> float | None:
    """Seconds of CPU the process's main thread has used; None where that cannot be read. Raises
    ProcessLookupError once the process is gone."""
    schedstat = _proc(pid, "schedstat")
    return None if schedstat is None else int(schedstat.split()[0]) / 1e9


def on_cpu(pid: int) -> bool | None:
    """Whether the process's main thread runs or waits for a CPU (state R); None where that cannot
    be read. Raises ProcessLookupError once the process is gone."""
    stat = _proc(pid, "stat")
    if stat is None:
        return None
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    if state == b"Z":
        raise ProcessLookupError(pid)
    return state == b"R"


def _proc(pid: int, name: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as file:
            return file.read()
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    except OSError:
        return None


def _main(pid: int, duration_s: float, parent: int) -> None:
    told_to_stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: told_to_stop.append(signum))
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -5)  # woken on time on a busy machine, where allowed
    except OSError:
        pass

    def going() -> bool:
        return not told_to_stop and os.getppid() == parent  # never past the orchestrator

    print(throttle(lambda sig: os.kill(pid, sig), pid, duration_s, going), flush=True)


if __name__ == "__main__":
    _main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
