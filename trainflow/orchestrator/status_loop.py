"""The status channel's sockets: one thread, one event loop (selectors) for every connection of a
job, however many; what each stream says is applied by the StatusServer (status.py).

A new connection counts only once its first line, a hello with the run's token and this
orchestrator's protocol version, arrives within the limits of `status_limits`; a hello of another
version is refused with a line saying why. Liveness is stamped when bytes are read, not when they
are applied, and the loop says up to when it has read everything (`read_through`): a loop starved
of the CPU on a loaded machine must not be taken for its peers falling silent. Every accepted
stream is answered (at most every ANSWER_EVERY_S, after something was read from it), so its sender
can tell a live orchestrator from a frozen one.
"""

from __future__ import annotations

import errno
import logging
import resource
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from trainflow.contracts.status_protocol import (
    PROTOCOL_VERSION,
    Answer,
    Hello,
    Malformed,
    NodeHello,
    Refused,
    decode,
    encode,
)
from trainflow.orchestrator.status_limits import ChannelLimits, LineBuffer, LineTooLong, PendingConnections

log = logging.getLogger("trainflow.orchestrator.status")

RECV_CHUNK = 256 * 1024
ANSWER_EVERY_S = 0.5
ACCEPTS_PER_TURN = 64  # then read: a hello already sent is read before more connections are let in
LISTEN_BACKLOG = 65535  # the kernel caps it at net.core.somaxconn
SWEEP_S = 0.2


class Stream(Protocol):
    """What the server makes of an accepted connection."""

    def lines(self, lines: list[bytes], read_at: float) -> None: ...

    def closed(self) -> None: ...


@dataclass
class _Connection:
    sock: socket.socket
    peer: str
    buffer: LineBuffer
    accepted_at: float
    stream: Stream | None = None
    answered_at: float = 0.0
    queued: list[bytes] = field(default_factory=list)


def raise_open_files_limit() -> int:
    """As many open files as this process may have: a connection per node (or per rank) of a job."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            pass
    return soft


class ChannelLoop:
    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        limits: ChannelLimits,
        open_stream: Callable[[Hello | NodeHello, str], Stream | str | None],
    ):
        self.token = token
        self.limits = limits
        self._open_stream = open_stream
        raise_open_files_limit()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(LISTEN_BACKLOG)
        self._listener.setblocking(False)
        self.address = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._connections: dict[int, _Connection] = {}
        self._pending = PendingConnections(limits)
        self._stopping = False
        # every byte that had arrived by this time has been read (the start of the last full turn):
        # a reader starved of the CPU says so by this lagging, not by its peers seeming silent
        self.read_through = time.time()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="trainflow-status-loop", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(5)
        for conn in list(self._connections.values()):
            self._close(conn)
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        swept = time.monotonic()
        while not self._stopping:
            turn = time.time()
            try:
                events = self._selector.select(SWEEP_S)
            except OSError:
                return
            for key, _ in events:
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    return
                else:
                    conn = self._connections.get(key.data)
                    if conn is not None:
                        self._read(conn)
            self.read_through = turn
            if time.monotonic() - swept >= SWEEP_S:
                swept = time.monotonic()
                self._sweep()

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    log.warning("status channel: out of open files, %d connections open", len(self._connections))
                return
            sock.setblocking(False)
            conn = _Connection(sock, str(address[0]), LineBuffer(self.limits.max_line_bytes), time.monotonic())
            self._connections[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, sock.fileno())
            self._pending.admit(sock, conn.peer)

    def _read(self, conn: _Connection) -> None:
        try:
            chunk = conn.sock.recv(RECV_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        read_at = time.time()
        if not chunk:
            self._close(conn)
            return
        try:
            lines = conn.buffer.feed(chunk)
        except LineTooLong as exc:
            if conn.stream is None:
                log.warning("status channel: dropped a connection from %s: %s", conn.peer, exc)
            else:
                log.warning("status channel: closed the connection of %s from %s: %s", conn.stream, conn.peer, exc)
            self._close(conn)
            return
        if conn.stream is None:
            if not lines:
                self._pending.heard(conn.sock)
                return
            if not self._hello(conn, lines[0]):
                self._close(conn)
                return
            lines = lines[1:]
        if lines and conn.stream is not None:  # bound by its hello
            conn.stream.lines(lines, read_at)
        now = time.monotonic()
        if now - conn.answered_at >= ANSWER_EVERY_S:
            conn.answered_at = now
            self._say(conn, Answer())

    def _hello(self, conn: _Connection, line: bytes) -> bool:
        if not self._pending.done(conn.sock):
            return False  # dropped meanwhile to make room for newer connections
        try:
            hello = decode(line)
            if not isinstance(hello, (Hello, NodeHello)):
                raise Malformed(f"first line is a {type(hello).kind!r} message, not a hello")
            if not secrets.compare_digest(hello.token.encode(), self.token.encode()):
                raise Malformed("wrong token")
        except Malformed as exc:
            log.warning("status channel: dropped a connection from %s: %s", conn.peer, exc)
            return False
        if hello.version != PROTOCOL_VERSION:
            reason = (
                f"status protocol version {hello.version}, this orchestrator speaks version {PROTOCOL_VERSION}: "
                f"workers and orchestrator must run the same trainflow"
            )
            log.warning("status channel: refused a connection from %s: %s", conn.peer, reason)
            self._say(conn, Refused(reason=reason))
            return False
        stream = self._open_stream(hello, conn.peer)
        if stream is None or isinstance(stream, str):
            if stream:
                log.warning("status channel: refused a connection from %s: %s", conn.peer, stream)
                self._say(conn, Refused(reason=stream))
            return False
        conn.stream = stream
        return True

    def _say(self, conn: _Connection, message: object) -> None:
        try:
            conn.sock.send(encode(message))
        except OSError:
            pass  # a peer that does not read its answers misses some; it reads the next

    def _sweep(self) -> None:
        """Connections still without their hello past the limit are dropped."""
        now = time.monotonic()
        for conn in list(self._connections.values()):
            if conn.stream is None and now - conn.accepted_at > self.limits.hello_timeout_s:
                log.warning(
                    "status channel: dropped a connection from %s: no hello within %.0fs",
                    conn.peer,
                    self.limits.hello_timeout_s,
                )
                self._close(conn)

    def _close(self, conn: _Connection) -> None:
        fd = conn.sock.fileno()
        if self._connections.pop(fd, None) is None:
            return
        self._pending.done(conn.sock)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        conn.sock.close()
        if conn.stream is not None:
            conn.stream.closed()
