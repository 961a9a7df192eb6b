"""Each rank's pid and global rank when its node's agent starts it, and its exit status the moment
torchrun reaps it: a file per node, one JSON line per event.

From outside, a rank that has gone looks the same whether it finished or died: its agent reaps it
and only reacts to a failure. A node whose ranks all exited 0 waits at torchrun's exit barrier for
the others; one whose rank died is about to stop its other ranks and exit with a failure report.
The orchestrator tells the two apart by this file. It also names each rank's process, which a
plain script's ranks never report themselves (a forked warm worker's /proc environment is its
zygote's, so RANK cannot be read from outside)."""

from __future__ import annotations

import json
import os
from pathlib import Path

RECORDS_ENV = "TRAINFLOW_RANK_RECORDS"  # the file; in the agent's environment, not passed on to ranks


def records_path(attempt_dir: Path, node: int) -> Path:
    return attempt_dir / f"node-{node}.ranks"


def read_exits(path: Path) -> dict[int, int]:
    """pid -> exit code (negative: the signal) of every rank that has exited, other than those
    another process was started in place of (rank_replacement.py); {} before any."""
    replaced = read_replaced(path)
    return {pid: code for pid, code in _pairs(path, "pid", "code").items() if pid not in replaced}


def read_replaced(path: Path) -> set[int]:
    """The pids of ranks that died and had a process started in their place."""
    return {int(entry["replaced"]) for entry in _entries(path) if isinstance(entry.get("replaced"), int)}


def read_ranks(path: Path) -> dict[int, int]:
    """Global rank -> pid of every rank started, exited or not."""
    return _pairs(path, "rank", "pid")


def _pairs(path: Path, key: str, value: str) -> dict[int, int]:
    pairs: dict[int, int] = {}
    for entry in _entries(path):
        try:
            pairs[int(entry[key])] = int(entry[value])
        except (ValueError, KeyError, TypeError):
            continue  # an event of the other kind
    return pairs


def _entries(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # not a line this module wrote
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def _append(path: str, entry: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())  # one short write: never seen half-written
    finally:
        os.close(fd)


def note_ended(path: str, pid: int, reason: str, hang: bool) -> None:
    """A rank the orchestrator is about to kill, and why: noted first, for its agent to read at its
    death (rank_replacement.py). `hang`: it was found frozen, and a process in its place goes on, its
    death the hang `reason`, not a kill; else it is not replaced, and the attempt ends."""
    _append(path, {"ended": pid, "reason": reason, "hang": hang})


def read_ended(path: Path) -> dict[int, tuple[str, bool]]:
    """pid -> (why, whether for a hang) of every rank the orchestrator ended."""
    return {
        int(e["ended"]): (str(e.get("reason", "")), bool(e.get("hang")))
        for e in _entries(path)
        if isinstance(e.get("ended"), int)
    }


def note_replaced(path: str, pid: int, local_rank: int, code: int) -> None:
    """A rank that died and has a process started in its place: noted before the new one starts, so
    that no reader takes the death for the node's failure."""
    _append(path, {"replaced": pid, "local_rank": local_rank, "code": code})


class RecordedProcess:
    """torchrun's handle on one rank (a Popen, or a warm worker's stand-in), which records the exit
    status the first time a poll or wait returns it."""

    def __init__(self, proc, local_rank: int, rank: int, path: str):
        self._proc = proc
        self._local_rank = local_rank
        self._path = path
        self._recorded = False
        _append(path, {"pid": proc.pid, "local_rank": local_rank, "rank": rank})

    def poll(self):
        return self._record(self._proc.poll())

    def peek(self):
        """The exit status, without recording it."""
        return self._proc.poll()

    def wait(self, *args, **kwargs):
        return self._record(self._proc.wait(*args, **kwargs))

    def __getattr__(self, name):
        return getattr(self._proc, name)

    def _record(self, code):
        if code is not None and not self._recorded:
            self._recorded = True
            _append(self._path, {"pid": self._proc.pid, "local_rank": self._local_rank, "code": code})
        return code


installed_path: str | None = None


def install_from_environment() -> None:
    """In the agent, before torchrun starts: every rank handle torchrun makes records its exit."""
    global installed_path
    path = os.environ.pop(RECORDS_ENV, None)
    if not path:
        return
    installed_path = path
    from torch.distributed.elastic.multiprocessing import api

    make_handler = api.get_subprocess_handler  # torchrun's, or the warm workers' forking one

    def recording_handler(*args, **kwargs):
        handler = make_handler(*args, **kwargs)
        rank = int(kwargs["env"].get("RANK", -1))
        handler.proc = RecordedProcess(handler.proc, kwargs["local_rank_id"], rank, path)
        return handler

    api.get_subprocess_handler = recording_handler
