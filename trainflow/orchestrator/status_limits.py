"""Bounds on the status channel before a connection has proved it knows the run's token.

Anyone who can reach the port can connect, so a connection gets a few seconds for its hello, no
line may exceed a size (read in chunks, never buffered whole), and only so many connections may
be waiting for their hello at once, per peer address and overall. When a limit is reached the
oldest waiting connection is dropped rather than the new one: a real worker sends its hello at
once, so idle connections cannot keep it out.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

RECV_CHUNK = 64 * 1024


@dataclass(frozen=True)
class ChannelLimits:
    hello_timeout_s: float = 5.0  # from accepting a connection to reading its hello
    max_line_bytes: int = 1 << 20  # any line, hello or later; a longer one closes the connection
    max_pending_per_peer: int = 32  # connections without a hello yet, from one address
    max_pending: int = 128  # connections without a hello yet, from everywhere


class LineTooLong(ValueError):
    pass


class LineReader:
    """Newline-terminated lines from a socket, holding at most one line's limit plus one chunk."""

    def __init__(self, sock: socket.socket, max_line_bytes: int):
        self._sock = sock
        self._limit = max_line_bytes
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer already known to hold no newline

    def line(self, deadline: float | None = None) -> bytes | None:
        """The next line (without its newline), or None once the peer has closed. Raises
        TimeoutError after `deadline` (time.monotonic), LineTooLong beyond the limit."""
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end > self._limit or (end < 0 and len(self._buffer) > self._limit):
                raise LineTooLong(f"a line longer than {self._limit} bytes")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("no complete line in time")
                self._sock.settimeout(remaining)
            chunk = self._sock.recv(RECV_CHUNK)
            if not chunk:
                return None
            self._buffer += chunk


class PendingConnections:
    """Connections still waiting for their hello, oldest first, per peer address and overall."""

    def __init__(self, limits: ChannelLimits):
        self._limits = limits
        self._lock = threading.Lock()
        self._waiting: OrderedDict[socket.socket, str] = OrderedDict()

    def admit(self, sock: socket.socket, peer: str) -> None:
        """Count `sock` as waiting; drop the oldest waiting ones that would exceed a limit."""
        with self._lock:
            evicted = []
            same_peer = [s for s, p in self._waiting.items() if p == peer]
            while len(same_peer) >= self._limits.max_pending_per_peer:
                evicted.append(same_peer.pop(0))
                del self._waiting[evicted[-1]]
            while len(self._waiting) >= self._limits.max_pending:
                oldest, _ = self._waiting.popitem(last=False)
                evicted.append(oldest)
            self._waiting[sock] = peer
        for old in evicted:
            _shut(old)  # its handler thread reads end-of-file and ends

    def done(self, sock: socket.socket) -> bool:
        """`sock` said hello (or gave up): no longer waiting. False if it had been dropped."""
        with self._lock:
            return self._waiting.pop(sock, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
