"""Bounds on the status channel before a connection has proved it knows the run's token.

Anyone who can reach the port can connect, so a connection gets a few seconds for its hello, no
line may exceed a size (read in chunks, never buffered whole), and only so many connections may
be waiting for their hello at once, per peer address and overall. When a limit is reached the
oldest waiting connection that has sent nothing at all is dropped (the oldest of all only when
every one has sent something): a real worker sends its hello at once, and the channel reads it as
soon as it arrives, so idle connections cannot keep it out.
"""

from __future__ import annotations

import socket
import threading
from collections import OrderedDict
from dataclasses import dataclass

from trainflow.relay.lines import LineBuffer, LineTooLong

__all__ = ["ChannelLimits", "LineBuffer", "LineTooLong", "PendingConnections"]


@dataclass(frozen=True)
class ChannelLimits:
    hello_timeout_s: float = 5.0  # from accepting a connection to reading its hello
    max_line_bytes: int = 1 << 20  # any line, hello or later; a longer one closes the connection
    max_pending_per_peer: int = 32  # connections without a hello yet, from one address
    max_pending: int = 1024  # connections without a hello yet, from everywhere (no thread each)


class PendingConnections:
    """Connections still waiting for their hello, oldest first, per peer address and overall."""

    def __init__(self, limits: ChannelLimits):
        self._limits = limits
        self._lock = threading.Lock()
        self._waiting: OrderedDict[socket.socket, str] = OrderedDict()
        self._heard: set[socket.socket] = set()

    def admit(self, sock: socket.socket, peer: str) -> None:
        """Count `sock` as waiting; drop the oldest waiting ones that would exceed a limit."""
        with self._lock:
            evicted = []
            same_peer = [s for s, p in self._waiting.items() if p == peer]
            while len(same_peer) >= self._limits.max_pending_per_peer:
                evicted.append(self._idlest(same_peer))
                same_peer.remove(evicted[-1])
                del self._waiting[evicted[-1]]
            while len(self._waiting) >= self._limits.max_pending:
                evicted.append(self._idlest(list(self._waiting)))
                del self._waiting[evicted[-1]]
            self._waiting[sock] = peer
        for old in evicted:
            _shut(old)  # its handler thread reads end-of-file and ends

    def heard(self, sock: socket.socket) -> None:
        """`sock` sent something (a hello under way): it is not idle."""
        with self._lock:
            self._heard.add(sock)

    def _idlest(self, candidates: list[socket.socket]) -> socket.socket:
        """The oldest of `candidates` that has sent nothing; the oldest of all if each has."""
        return next((s for s in candidates if s not in self._heard), candidates[0])

    def done(self, sock: socket.socket) -> bool:
        """`sock` said hello (or gave up): no longer waiting. False if it had been dropped."""
        with self._lock:
            self._heard.discard(sock)
            return self._waiting.pop(sock, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
