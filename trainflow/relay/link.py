"""One stream of the status channel seen from its sending end: connect (TCP `host:port` or
`unix:/path`), say hello, send lines, hear the receiver's answers.

A failed connection is retried with exponential backoff and jitter, so a job's ranks or nodes that
lose the orchestrator together do not come back as one storm; whoever sends keeps what could not be
sent. `answered_at` is when the receiver last answered (time.monotonic): a receiver that is frozen
accepts bytes into its socket buffer for a long while, but answers nothing.
"""

from __future__ import annotations

import random
import select
import socket
import threading
import time
from collections.abc import Callable

from trainflow.contracts.status_protocol import Answer, Malformed, Refused, decode, encode

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
SEND_TIMEOUT_S = 10.0  # a receiver that reads nothing this long (frozen) breaks the stream, not its sender
MAX_ANSWER_BYTES = 1 << 16


def parse_address(address: str) -> tuple[int, object]:
    """(socket family, address) of `host:port` or `unix:/path`."""
    if address.startswith("unix:"):
        return socket.AF_UNIX, address.removeprefix("unix:")
    host, _, port = address.rpartition(":")
    return socket.AF_INET, (host, int(port))


class StreamLink:
    def __init__(
        self,
        address: str,
        hello: Callable[[], object],
        connect_timeout_s: float = 2.0,
        source_host: str | None = None,
        on_answer: Callable[[], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
        read_in_thread: bool = True,
    ):
        self._family, self._address = parse_address(address)
        self._hello = hello
        self._connect_timeout = connect_timeout_s
        self._source = source_host
        self._on_answer = on_answer
        self._on_refused = on_refused
        self._read_in_thread = read_in_thread
        self._sock: socket.socket | None = None
        self._closing = threading.Event()  # set once the receiver closed the current connection
        self._inbox = bytearray()
        self._next_try = 0.0
        self._failures = 0
        self.answered_at = time.monotonic()
        self.connects = 0  # connections made, the first included
        self.failed_tries = 0

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def send(self, data: bytes) -> bool:
        """Send `data` (whole lines), connecting first if need be; False if it did not go out (not
        connected, or the connection broke: the caller keeps it and tries again later)."""
        if self._sock is None and not self._connect():
            return False
        sock = self._sock  # the answers' reader may find it broken meanwhile
        if sock is None:
            return False
        try:
            sock.sendall(data)
            return True
        except OSError:
            self._broken(sock)
            return False

    def retry_in(self) -> float:
        """Seconds until the next connection attempt is due (0: now)."""
        return max(0.0, self._next_try - time.monotonic())

    def pump(self) -> None:
        """Read the answers that have arrived, without waiting (a link read by its owner's loop)."""
        sock = self._sock
        if sock is None:
            return
        # a socket with a timeout waits that long even for MSG_DONTWAIT: ask first whether anything came
        ready = select.poll()  # not select(): a driver of thousands of links has descriptors above 1024
        ready.register(sock, select.POLLIN)
        while ready.poll(0):
            try:
                chunk = sock.recv(MAX_ANSWER_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._broken(sock)
                return
            if not chunk:
                self._closing.set()
                self._broken(sock)
                return
            self._heard(chunk)

    def close(self, drain_s: float = 0.0) -> None:
        """End the stream. With `drain_s`, gracefully: no more lines, then wait (that long at most)
        for the receiver to close its end, so that answers left unread never reset the connection
        and take the last lines sent with it."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if drain_s > 0:
            try:
                sock.shutdown(socket.SHUT_WR)
                self._closing.wait(drain_s)
            except OSError:
                pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def _connect(self) -> bool:
        if time.monotonic() < self._next_try:
            return False
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        try:
            sock.settimeout(self._connect_timeout)
            if self._source is not None:
                sock.bind((self._source, 0))
            sock.connect(self._address)
            if self._family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(SEND_TIMEOUT_S)
            sock.sendall(encode(self._hello()))
        except OSError:
            sock.close()
            self.failed_tries += 1
            self._failures += 1
            delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** min(self._failures - 1, 10))
            self._next_try = time.monotonic() + delay * random.uniform(0.5, 1.5)
            return False
        self._failures = 0
        self._sock = sock
        self._inbox.clear()
        self._closing = threading.Event()
        self.connects += 1
        if self._read_in_thread:
            threading.Thread(target=self._read, args=(sock,), name="trainflow-status-answers", daemon=True).start()
        return True

    def _broken(self, sock: socket.socket | None = None) -> None:
        if sock is not None and sock is not self._sock:
            return
        self.close()
        self._next_try = time.monotonic() + BACKOFF_FIRST_S * random.uniform(0.5, 1.5)

    def _read(self, sock: socket.socket) -> None:
        closing = self._closing
        while True:
            try:
                chunk = sock.recv(MAX_ANSWER_BYTES)
            except TimeoutError:
                continue  # nothing to hear for a while; whether that is too long is the owner's to judge
            except OSError:
                chunk = b""
            if not chunk:
                closing.set()
                if sock is self._sock:
                    self._broken(sock)
                return
            self._heard(chunk)

    def _heard(self, chunk: bytes) -> None:
        self._inbox += chunk
        if len(self._inbox) > MAX_ANSWER_BYTES and b"\n" not in self._inbox:
            self._inbox.clear()
            return
        *lines, rest = self._inbox.split(b"\n")
        self._inbox = bytearray(rest)
        for line in lines:
            try:
                message = decode(line)
            except Malformed:
                continue
            match message:
                case Answer():
                    self.answered_at = time.monotonic()
                    if self._on_answer is not None:
                        self._on_answer()
                case Refused(reason=reason):
                    if self._on_refused is not None:
                        self._on_refused(reason)
