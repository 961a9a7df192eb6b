"""A node's output kept within a bound, in the agent that writes it: the node log keeps the first
and the last bytes, says how much it dropped between them, and never holds more on disk.

The local backend's agent gets its node log as stdout and stderr. Started with `TRAINFLOW_LOG_MAX_BYTES`
set, the agent puts a pipe in their place, which it and its ranks write to (the ranks inherit it),
and a thread of the agent writes what comes through into the log: as it comes until half the bound,
then only the newest half, rewritten in place behind a line saying what was dropped. Each rank's
stderr comes through a pipe of its own, into the node log with torchrun's `[default<local rank>]:`
in front of every line, and its last lines into a small file of its own (`rank-<local rank>.stderr`
in torchrun's log folder), which a failure report quotes. torchrun's own `--redirects`/`--tee`
would keep a second and third full copy of every rank's stderr.

Stdlib only: this runs inside the agent, and the warm workers fork it.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import termios
import threading
import time
from collections import deque
from pathlib import Path

LOG_LIMIT_ENV = "TRAINFLOW_LOG_MAX_BYTES"  # the node log's bound; in the agent's environment only
RANK_STDERR_ENV = "TRAINFLOW_RANK_STDERR_DIR"  # where each rank's last stderr lines are kept
RANK_TAIL_BYTES = 16_000
REWRITE_EVERY_S = 1.0  # once over the bound, the kept tail is rewritten at most this often, and at the end
READ_BYTES = 1 << 16
DRAIN_S = 5.0


def torchrun_log_dir(attempt_dir: Path, node: int) -> Path:
    """Where a node's agent keeps its ranks' stderr tails and torchrun's error files (`--log-dir`)."""
    return attempt_dir / "torchrun" / f"node-{node}"


def rank_stderr_path(folder: Path, local_rank: int) -> Path:
    return folder / f"rank-{local_rank}.stderr"


class BoundedLog:
    """Bytes written to `fd` (the node log), at most `limit` of them (and one line saying what was
    dropped): the first half as they come, then the newest half, rewritten in place."""

    def __init__(self, fd: int, limit: int):
        self.fd = fd
        # positioned writes: the launcher opened the log to append, which would put them all at its end
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_APPEND)
        self.head = limit // 2
        self.tail_size = limit - self.head
        self.written = os.fstat(fd).st_size  # a log with lines already in it (a warm agent's)
        self.tail: deque[bytes] = deque()  # the newest bytes past the head, at most tail_size of them
        self.tail_bytes = 0
        self.dropped = 0
        self.rewritten_at = 0.0
        self.dirty = False
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self.written < self.head:
                first, data = data[: self.head - self.written], data[self.head - self.written :]
                os.pwrite(self.fd, first, self.written)
                self.written += len(first)
            if not data:
                return
            self.tail.append(data)
            self.tail_bytes += len(data)
            self._drop_oldest()
            self.dirty = True
            if self.dropped == 0:  # nothing dropped yet: the log grows as it comes
                os.pwrite(self.fd, data, self.written + self.tail_bytes - len(data))
                self.dirty = False
            elif time.monotonic() - self.rewritten_at >= REWRITE_EVERY_S:
                self._rewrite()

    def _drop_oldest(self) -> None:
        while self.tail_bytes > self.tail_size:
            excess = self.tail_bytes - self.tail_size
            oldest = self.tail[0]
            if len(oldest) <= excess:
                self.tail.popleft()
                cut = len(oldest)
            else:
                self.tail[0] = oldest[excess:]
                cut = excess
            self.tail_bytes -= cut
            self.dropped += cut

    def flush(self) -> None:
        with self._lock:
            if self.dirty:
                self._rewrite()

    def _rewrite(self) -> None:
        kept = b"".join(self.tail)
        newline = kept.find(b"\n")
        if 0 <= newline < len(kept) - 1:  # the kept part starts at a line's start
            kept = kept[newline + 1 :]
        dropped = self.dropped + self.tail_bytes - len(kept)
        note = (
            f"\n[trainflow: {dropped} bytes of this node's output dropped here; the log keeps its first "
            f"{self.head} and last {self.tail_size} bytes (tracking.max_node_log_mb)]\n"
        ).encode()
        os.pwrite(self.fd, note + kept, self.written)
        os.ftruncate(self.fd, self.written + len(note) + len(kept))
        self.rewritten_at = time.monotonic()
        self.dirty = False


class RankTail:
    """A rank's last stderr bytes, in a small file of their own, up to date as they come."""

    def __init__(self, path: Path):
        self.path = path
        self.kept = bytearray()
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)

    def write(self, data: bytes) -> None:
        self.kept += data
        del self.kept[: max(0, len(self.kept) - RANK_TAIL_BYTES)]
        os.pwrite(self.fd, bytes(self.kept), 0)
        os.ftruncate(self.fd, len(self.kept))


def _prefixed(data: bytes, prefix: bytes, at_line_start: bool) -> tuple[bytes, bool]:
    """`data` with `prefix` at the start of every line; whether the next byte starts a line."""
    lines = data.split(b"\n")
    out = [(prefix if at_line_start else b"") + lines[0]]
    out.extend(prefix + line if line else line for line in lines[1:])
    return b"\n".join(out), data.endswith(b"\n")


class Pump(threading.Thread):
    """Copies a pipe into the node log (with a prefix on each line) and, for a rank, its tail file."""

    def __init__(self, fd: int, log: BoundedLog, prefix: bytes = b"", tail: RankTail | None = None):
        super().__init__(name=f"output-pump-{fd}", daemon=True)
        self.fd, self.log, self.prefix, self.rank_tail = fd, log, prefix, tail
        self.waiting = threading.Event()  # blocked in read: all it was given is in the log

    def run(self) -> None:
        at_line_start = True
        while True:
            self.waiting.set()
            try:
                data = os.read(self.fd, READ_BYTES)
            except OSError:
                break
            self.waiting.clear()
            if not data:
                break
            if self.rank_tail is not None:
                self.rank_tail.write(data)
            if self.prefix:
                data, at_line_start = _prefixed(data, self.prefix, at_line_start)
            self.log.write(data)
        os.close(self.fd)

    def drained(self) -> bool:
        """Done, or waiting on an empty pipe (a process that outlived its rank may hold it open)."""
        if not self.is_alive():
            return True
        try:
            pending = struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            return True
        return pending == 0 and self.waiting.is_set()


class BoundedOutput:
    """In the agent: its stdout and stderr, and every rank's, through pumps into the bounded node log."""

    def __init__(self, limit: int, rank_folder: Path | None):
        self.log = BoundedLog(os.dup(1), limit)
        self.rank_folder = rank_folder
        self.pumps: list[Pump] = []
        read, write = os.pipe()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self._start(Pump(read, self.log))

    def _start(self, pump: Pump) -> None:
        self.pumps.append(pump)
        pump.start()

    def rank_stderr(self, local_rank: int) -> int:
        """The write end of a new pipe for a rank's stderr (the caller closes it once the rank has it)."""
        read, write = os.pipe()
        tail = None
        if self.rank_folder is not None:
            self.rank_folder.mkdir(parents=True, exist_ok=True)
            tail = RankTail(rank_stderr_path(self.rank_folder, local_rank))
        self._start(Pump(read, self.log, f"[default{local_rank}]:".encode(), tail))
        return write

    def close(self) -> None:
        """At the agent's end: what is still in the pipes goes into the log first."""
        for fd in (1, 2):
            os.close(fd)
        deadline = time.monotonic() + DRAIN_S
        quiet = 0
        while time.monotonic() < deadline and quiet < 2:  # twice in a row: a read may just have returned
            quiet = quiet + 1 if all(pump.drained() for pump in self.pumps) else 0
            time.sleep(0.02)
        self.log.flush()


_installed: BoundedOutput | None = None


def install_from_environment() -> None:
    """In the agent, before torchrun starts: bound the node log and give each rank a stderr pipe."""
    global _installed
    limit = os.environ.pop(LOG_LIMIT_ENV, None)
    folder = os.environ.pop(RANK_STDERR_ENV, None)
    if not limit or not stat.S_ISREG(os.fstat(1).st_mode):  # a pipe or terminal: whoever reads it bounds it
        return
    from torch.distributed.elastic.multiprocessing import api

    _installed = output = BoundedOutput(int(limit), Path(folder) if folder else None)
    make_handler = api.get_subprocess_handler  # torchrun's, or the warm workers' forking one

    def handler_with_stderr_pipe(*args, **kwargs):
        write = output.rank_stderr(kwargs["local_rank_id"])
        try:
            return make_handler(*args, **{**kwargs, "stderr": f"/dev/fd/{write}"})
        finally:
            os.close(write)  # the handler opened its own; the rank holds it

    api.get_subprocess_handler = handler_with_stderr_pipe


def close_installed() -> None:
    if _installed is not None:
        _installed.close()
