"""A node's relay: its ranks report here (a Unix socket in the node's private scratch), and it sends
one stream for the whole node to the orchestrator (status_protocol.py: NodeHello, NodeReport,
RankEvent). It runs in the node's torchrun agent (trainflow.backends.agent), on every backend.

Events (a checkpoint committed, an error) and a step once every rank of the node has reported it
are sent at once, the rest with the next report. A rank's connection counts once its hello carries the
run's token, this protocol's version and the relay's own node and attempt; it is then bound to that rank and process.
The relay reports every
REPORT_EVERY_S what changed (aggregator.py), and every heartbeat interval the age of every rank's
last line, so the node heartbeats even while it has no rank (a plain script's node). When the
orchestrator answers, the relay answers its ranks; a rank that hears nothing for
orchestrator_timeout_s stops (runtime/reporter.py). A lost uplink is reconnected with backoff
and jitter; what could not be sent is sent first once it is back (events and step sums, at most
MAX_BACKLOG_BYTES; the marks are fresh at every report).
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass

from trainflow.contracts.status_protocol import (
    PROTOCOL_VERSION,
    Answer,
    Heartbeat,
    Hello,
    Malformed,
    NodeHello,
    Progress,
    Refused,
    Replaced,
    decode,
    encode,
)
from trainflow.relay.aggregator import NodeAggregator
from trainflow.relay.lines import LineBuffer, LineTooLong
from trainflow.relay.link import StreamLink

log = logging.getLogger("trainflow.relay")

REPORT_EVERY_S = 0.2
ANSWER_EVERY_S = 0.5
HELLO_TIMEOUT_S = 10.0
MAX_LINE_BYTES = 1 << 20
MAX_BACKLOG_BYTES = 64 << 20
SOCKET_NAME = "status.sock"
UNIX_PATH_MAX = 100  # sun_path holds 108 bytes; a longer scratch path falls back to loopback TCP


@dataclass
class _Rank:
    sock: socket.socket
    lines: LineBuffer
    opened_at: float
    rank: int | None = None
    pid: int | None = None


class NodeRelay:
    def __init__(
        self,
        orchestrator: str,
        token: str,
        node: int,
        attempt: int,
        heartbeat_interval_s: float,
        scratch: str | None = None,
    ):
        self.node = node
        self.attempt = attempt
        self._token = token
        self._lock = threading.Lock()
        self._aggregator = NodeAggregator(node, heartbeat_interval_s)
        self._uplink = StreamLink(
            orchestrator,
            lambda: NodeHello(token=token, node=node, attempt=attempt, version=PROTOCOL_VERSION),
            on_answer=self._orchestrator_answered,
            on_refused=self._refused,
        )
        self._listener, self.address = _listen(scratch)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._ranks: dict[int, _Rank] = {}
        self._backlog = bytearray()
        self._answer_due = False
        self._answered_ranks_at = 0.0
        self._stop = threading.Event()
        self._urgent = threading.Event()  # an event arrived: sent at once, not with the next report
        self._serving = threading.Thread(target=self._serve, name="trainflow-relay-ranks", daemon=True)
        self._sending = threading.Thread(target=self._send_reports, name="trainflow-relay-uplink", daemon=True)
        self._serving.start()
        self._sending.start()

    def close(self, timeout: float = 5.0) -> None:
        """Read what the ranks sent to its end, send the node's last report, close the stream."""
        deadline = time.monotonic() + timeout
        while self._ranks and time.monotonic() < deadline:
            time.sleep(0.02)  # ranks that exited: their connections reach their end
        self._stop.set()
        self._urgent.set()
        self._serving.join(max(0.0, deadline - time.monotonic()))
        self._sending.join(max(0.0, deadline - time.monotonic()))
        self._flush(final=True)
        self._uplink.close(drain_s=max(0.5, deadline - time.monotonic()))
        self._listener.close()
        if self.address.startswith("unix:"):
            try:
                os.unlink(self.address.removeprefix("unix:"))
            except OSError:
                pass

    # ---- the ranks' side ------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.1):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data)
            now = time.monotonic()
            if self._answer_due and now - self._answered_ranks_at >= ANSWER_EVERY_S:
                self._answer_due, self._answered_ranks_at = False, now
                answer = encode(Answer())
                for conn in list(self._ranks.values()):
                    if conn.rank is not None:
                        _say(conn.sock, answer)
            for fd, conn in list(self._ranks.items()):
                if conn.rank is None and now - conn.opened_at > HELLO_TIMEOUT_S:
                    self._drop(fd, f"no hello within {HELLO_TIMEOUT_S:.0f}s")
        for fd in list(self._ranks):
            self._read(fd)  # what is left in their sockets
        self._selector.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            self._ranks[sock.fileno()] = _Rank(sock, LineBuffer(MAX_LINE_BYTES), time.monotonic())
            self._selector.register(sock, selectors.EVENT_READ, sock.fileno())

    def _read(self, fd: int) -> None:
        conn = self._ranks.get(fd)
        if conn is None:
            return
        while True:
            try:
                chunk = conn.sock.recv(256 * 1024)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                chunk = b""
            now = time.time()
            if not chunk:
                self._end(fd)
                return
            try:
                lines = conn.lines.feed(chunk)
            except LineTooLong as exc:
                self._drop(fd, str(exc))
                return
            if lines and conn.rank is None:
                if not self._hello(conn, lines[0], now):
                    self._drop(fd, None)
                    return
                lines = lines[1:]
            messages = []
            for line in lines:
                try:
                    messages.append(decode(line))
                except Malformed as exc:
                    log.warning("trainflow relay: dropped a message of rank %s: %s", conn.rank, exc)
            with self._lock:
                for message in messages:
                    self._aggregator.apply(conn.rank, conn.pid, message, now)
            if self._aggregator.step_complete or any(not isinstance(m, (Heartbeat, Progress)) for m in messages):
                self._urgent.set()  # a step every rank of the node took, a checkpoint, an error: now

    def _hello(self, conn: _Rank, line: bytes, now: float) -> bool:
        try:
            hello = decode(line)
            if not isinstance(hello, Hello):
                raise Malformed("the first line is not a hello")
            if not secrets.compare_digest(hello.token.encode(), self._token.encode()):
                raise Malformed("wrong token")
        except Malformed as exc:
            log.warning("trainflow relay: dropped a connection: %s", exc)
            return False
        if hello.version != PROTOCOL_VERSION:
            _say(
                conn.sock,
                Refused(
                    reason=f"status protocol version {hello.version}, this node's relay speaks "
                    f"version {PROTOCOL_VERSION}"
                ),
            )
            return False
        if (hello.node, hello.attempt) != (self.node, self.attempt):
            _say(
                conn.sock,
                Refused(
                    reason=f"this relay serves node {self.node} of attempt {self.attempt}, "
                    f"not node {hello.node} of attempt {hello.attempt}"
                ),
            )
            return False
        # a process started in place of one that died may say so before the dead one's end is read
        if any(
            other.rank == hello.rank and other.pid != hello.pid and other.pid not in hello.replaces
            for other in self._ranks.values()
        ):
            log.warning("trainflow relay: rank %d is already another process", hello.rank)
            return False
        conn.rank, conn.pid = hello.rank, hello.pid
        with self._lock:
            if hello.replaces:
                self._aggregator.apply(hello.rank, hello.pid, Replaced(pids=list(hello.replaces)), now)
            else:
                self._aggregator.heard(hello.rank, hello.pid, now)
        if hello.replaces:
            self._urgent.set()  # the orchestrator follows the rank to its new pid before it hears it silent
        return True

    def _end(self, fd: int) -> None:
        conn = self._ranks.pop(fd)
        self._selector.unregister(conn.sock)
        conn.sock.close()
        if conn.rank is not None:
            with self._lock:
                self._aggregator.closed(conn.rank)

    def _drop(self, fd: int, reason: str | None) -> None:
        conn = self._ranks.pop(fd)
        if reason:
            log.warning("trainflow relay: dropped a connection: %s", reason)
        self._selector.unregister(conn.sock)
        conn.sock.close()

    # ---- the orchestrator's side -------------------------------------------------------------------

    def _send_reports(self) -> None:
        while not self._stop.is_set():
            self._urgent.wait(REPORT_EVERY_S)
            self._urgent.clear()
            if not self._stop.is_set():
                self._flush()

    def _flush(self, final: bool = False) -> None:
        reconnecting = not self._uplink.connected
        with self._lock:
            report, events = self._aggregator.report(time.time(), everyone=reconnecting or final)
        # marks and sums first: a rank's `finished` counts at the step it was seen at
        data = (encode(report) if report is not None else b"") + b"".join(encode(e) for e in events)
        if reconnecting and not self._uplink.retry_in() == 0:
            self._keep(data)
            return
        if self._backlog:
            data, self._backlog = bytes(self._backlog) + data, bytearray()
        if data and not self._uplink.send(data):
            self._keep(data)

    def _keep(self, data: bytes) -> None:
        if len(self._backlog) + len(data) <= MAX_BACKLOG_BYTES:
            self._backlog += data

    def _orchestrator_answered(self) -> None:
        self._answer_due = True

    def _refused(self, reason: str) -> None:
        print(f"trainflow: the orchestrator refused node {self.node}'s relay: {reason}", file=sys.stderr, flush=True)


def start_for_node() -> NodeRelay | None:
    """In a node's agent: the relay its ranks will report to (their environment names it), if
    the orchestrator gave this node a worker configuration."""
    from trainflow.worker_config import CONFIG_ENV, RELAY_ENV, WorkerConfig

    if not os.environ.get(CONFIG_ENV):
        return None
    config = WorkerConfig.from_env()
    relay = NodeRelay(
        config.status_address,
        config.status_token,
        config.node,
        config.attempt,
        config.heartbeat_interval_s,
        scratch=config.node_scratch,
    )
    os.environ[RELAY_ENV] = relay.address
    return relay


def _listen(scratch: str | None) -> tuple[socket.socket, str]:
    """A Unix socket in the node's private scratch (only its owner can reach it), or loopback TCP."""
    if scratch:
        path = os.path.join(scratch, SOCKET_NAME)
        if len(path) <= UNIX_PATH_MAX:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o077)
            try:
                sock.bind(path)
            finally:
                os.umask(old)
            sock.listen(1024)
            return sock, f"unix:{path}"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock, f"127.0.0.1:{sock.getsockname()[1]}"


def _say(sock: socket.socket, message: object) -> None:
    try:
        sock.send(message if isinstance(message, bytes) else encode(message))
    except OSError:
        pass
