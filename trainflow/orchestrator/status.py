"""The orchestrator's side of the status channel: one TCP server, JSON lines from every worker.

It keeps, per rank, the last heartbeat, the last step and when that step was reached, and queues
every rank's step reports (rank_steps.py), the nodes' figures and the events for the watch task.

A connection counts only once its first line, a hello with the run's token, arrives within the
limits of `status_limits` (time, line size, connections waiting). The hello binds the connection
to one identity (rank, node, attempt, pid): every later message on it speaks for that rank, one
that claims another identity is dropped, and so are messages of another attempt. Malformed lines
are dropped with one log line. An attempt has finished only once every rank of its world has
reported `finished`, each from its own connection, at the step the orchestrator saw it reach.
"""

from __future__ import annotations

import logging
import queue
import secrets
import socket
import socketserver
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace

from trainflow.contracts import WorkerMilestones
from trainflow.orchestrator.rank_steps import StepReport, mean_over_ranks
from trainflow.orchestrator.status_limits import ChannelLimits, LineReader, LineTooLong, PendingConnections
from trainflow.orchestrator.status_messages import HELLO, Identity, Malformed, identity_of, parse_line

log = logging.getLogger(__name__)

COMPUTE_WINDOW = 64  # recent per-step compute times kept per rank, for straggler detection


@dataclass
class RankStatus:
    rank: int
    node: int
    pid: int | None = None
    last_seen: float = 0.0
    step: int = 0
    step_time_s: float | None = None
    progressed_at: float = 0.0
    compute_s: deque = field(default_factory=lambda: deque(maxlen=COMPUTE_WINDOW))


@dataclass
class AttemptStatus:
    attempt: int
    world_size: int | None = None  # None: as the workers announce it (their `started` messages)
    started_at: float = field(default_factory=time.time)
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    finished: dict | None = None  # once every rank has finished: rank 0's report, loss the mean over ranks
    finished_ranks: dict[int, dict] = field(default_factory=dict)  # each rank's own finished report
    errors: list[dict] = field(default_factory=list)
    restored_step: int | None = None
    first_step_at: float | None = None
    milestones: WorkerMilestones = field(default_factory=WorkerMilestones)  # the slowest rank's start-up
    preempted: dict | None = None
    diverged: dict | None = None

    def min_step(self) -> int:
        return min((r.step for r in self.ranks.values()), default=0)

    def max_step(self) -> int:
        return max((r.step for r in self.ranks.values()), default=0)

    def all_finished(self) -> bool:
        """Every rank of the world reported finished, all at one step, the step each was seen at."""
        if not self.world_size or set(self.finished_ranks) != set(range(self.world_size)):
            return False
        steps = {report["step"] for report in self.finished_ranks.values()}
        return len(steps) == 1 and all(self.ranks[rank].step in steps for rank in self.finished_ranks)


class StatusServer:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, advertise_host: str | None = None,
        limits: ChannelLimits = ChannelLimits(),
    ):
        self.token = secrets.token_hex(16)
        self.limits = limits
        self.steps: queue.Queue[StepReport] = queue.Queue()  # every rank's report of every step
        self.metrics: queue.Queue = queue.Queue()  # (step, t, figures) of the nodes' resources
        self.events: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._attempt = AttemptStatus(attempt=0)
        self._connections: set[socket.socket] = set()
        self._open: Counter[tuple[int, int]] = Counter()  # (attempt, node) -> bound connections not yet at their end
        self._pending = PendingConnections(limits)
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve(self.request, str(self.client_address[0]))

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128  # every worker of a large job connects at once

            def verify_request(self, request, client_address) -> bool:
                # in the accepting thread, before a handler thread exists for it
                server._pending.admit(request, str(client_address[0]))
                return True

        self._server = Server((host, port), Handler)
        bound_host, self.port = self._server.server_address[:2]
        self.host = advertise_host or str(bound_host)  # where workers connect; may differ from 0.0.0.0
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,), daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def begin_attempt(self, attempt: int, world_size: int | None = None) -> None:
        """From now on only attempt `attempt` counts; it has `world_size` ranks (None: as announced)."""
        with self._lock:
            self._attempt = AttemptStatus(attempt=attempt, world_size=world_size)
            # what the last attempt's workers sent after its watch ended (errors of ranks being
            # stopped, their last steps) is theirs: the next watcher must not read it as its own
            for queued in (self.steps, self.metrics, self.events):
                while True:
                    try:
                        queued.get_nowait()
                    except queue.Empty:
                        break

    def snapshot(self) -> AttemptStatus:
        """A consistent copy of what is known about the current attempt."""
        with self._lock:
            current = self._attempt
            return AttemptStatus(
                attempt=current.attempt,
                world_size=current.world_size,
                started_at=current.started_at,
                ranks={k: RankStatus(**{**vars(v), "compute_s": deque(v.compute_s)}) for k, v in current.ranks.items()},
                finished=dict(current.finished) if current.finished else None,
                finished_ranks={k: dict(v) for k, v in current.finished_ranks.items()},
                errors=list(current.errors),
                restored_step=current.restored_step,
                first_step_at=current.first_step_at,
                milestones=replace(current.milestones),
                preempted=current.preempted,
                diverged=current.diverged,
            )

    def open_connections(self, nodes) -> int:
        """How many of the current attempt's connections from these nodes are still being read: a
        worker's last messages are applied only once its connection reached its end."""
        with self._lock:
            return sum(self._open[(self._attempt.attempt, node)] for node in nodes)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for conn in list(self._connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self._connections.clear()
        self._thread.join(5)

    def _serve(self, conn: socket.socket, peer: str) -> None:
        with self._lock:
            self._connections.add(conn)
        lines = LineReader(conn, self.limits.max_line_bytes)
        try:
            identity = self._hello(conn, peer, lines)
            if identity is not None:
                conn.settimeout(None)  # a worker may stay quiet; it is known now
                key = (identity.attempt, identity.node)
                with self._lock:
                    self._open[key] += 1
                try:
                    self._listen(identity, peer, lines)
                finally:
                    with self._lock:
                        self._open[key] -= 1
        except OSError:
            pass  # the peer went away, or the server is closing
        finally:
            self._pending.done(conn)
            with self._lock:
                self._connections.discard(conn)

    def _hello(self, conn: socket.socket, peer: str, lines: LineReader) -> Identity | None:
        """The identity a new connection proves with the token, or None (then it is dropped)."""
        try:
            line = lines.line(deadline=time.monotonic() + self.limits.hello_timeout_s)
            if line is None:
                return None
            hello = parse_line(line)
            if hello["kind"] != HELLO:
                raise Malformed(f"first line is a {hello['kind']!r} message, not a hello")
            if not secrets.compare_digest(str(hello.get("token", "")).encode(), self.token.encode()):
                raise Malformed("wrong token")
            identity = identity_of(hello)
        except TimeoutError:
            log.warning("status channel: dropped a connection from %s: no hello within %.0fs",
                        peer, self.limits.hello_timeout_s)
            return None
        except (Malformed, LineTooLong) as exc:
            log.warning("status channel: dropped a connection from %s: %s", peer, exc)
            return None
        if not self._pending.done(conn):
            return None  # dropped meanwhile to make room for newer connections
        return identity

    def _listen(self, identity: Identity, peer: str, lines: LineReader) -> None:
        """Every line after the hello (itself a heartbeat) until the peer closes. Whatever is
        dropped or ignored is logged once per connection, however much follows."""
        dropped = 0
        refused = False

        def apply(message: dict) -> None:
            nonlocal refused
            refusal = self._receive(identity, message)
            if refusal and not refused:
                refused = True
                log.warning("status channel: ignoring rank %d from %s: %s", identity.rank, peer, refusal)

        try:
            apply({"kind": "heartbeat", "t": time.time()})
            while (line := lines.line()) is not None:
                try:
                    message = parse_line(line)
                    claimed = identity.claims_otherwise(message)
                    if claimed:
                        raise Malformed(f"claims another {claimed} ({message[claimed]!r})")
                except Malformed as exc:
                    dropped += 1
                    if dropped == 1:
                        log.warning("status channel: dropped a message from %s (rank %d): %s", peer, identity.rank, exc)
                    continue
                apply(message)
        except LineTooLong as exc:
            log.warning("status channel: closed the connection of rank %d from %s: %s", identity.rank, peer, exc)
        finally:
            if dropped > 1:
                log.warning("status channel: dropped %d messages in all from %s (rank %d)", dropped, peer, identity.rank)

    def _receive(self, identity: Identity, message: dict) -> str | None:
        """Apply one message of a bound connection; says why when its rank may not speak now."""
        now = time.time()
        kind = message["kind"]
        message = identity.stamp(message)
        with self._lock:
            current = self._attempt
            if identity.attempt != current.attempt:
                return None  # a worker of another attempt: it counts once (or as long as) that one runs
            refusal = self._refusal(current, identity)
            if refusal:
                return refusal
            rank = identity.rank
            status = current.ranks.setdefault(rank, RankStatus(rank=rank, node=identity.node, pid=identity.pid))
            status.last_seen = now
            if kind == "progress":  # a batch of steps: one message per step would cost tiny steps dearly
                for entry in message["steps"]:
                    status.step = entry["step"]
                    status.step_time_s = entry.get("step_time_s")
                    if entry.get("compute_s") is not None:
                        status.compute_s.append(float(entry["compute_s"]))
                    if current.first_step_at is None:
                        current.first_step_at = min(now, float(entry.get("t", now)))
                status.progressed_at = now
            elif kind == "started":
                if current.world_size is None and message.get("world_size"):
                    current.world_size = message["world_size"]
                for point in ("process_started_at", "imported_at", "rendezvous_at"):
                    current.milestones.reached(point, message.get(point))
            elif kind == "restored":
                current.restored_step = message["step"]
                status.step = current.restored_step
                current.milestones.reached("restored_at", message["t"])
            elif kind == "finished":
                current.finished_ranks[rank] = message
            elif kind == "error":
                current.errors.append(message)
            elif kind == "preempted":
                if current.preempted is None or message.get("signalled"):
                    current.preempted = message  # prefer the rank that received the signal
            elif kind == "diverged":
                current.diverged = message
            newly_finished = current.finished is None and current.all_finished()
            if newly_finished:  # rank 0's hash is the run's; the loss is the mean over the ranks
                losses = {r: m["loss"] for r, m in current.finished_ranks.items() if m.get("loss") is not None}
                current.finished = {**current.finished_ranks[0], "loss": mean_over_ranks(losses) if losses else None}
            # queued under the lock, so that begin_attempt() drops all of the last attempt's
            if kind == "progress":
                for entry in message["steps"]:
                    self.steps.put(StepReport.of_entry(identity.rank, entry, message["t"]))
            elif kind == "resources":  # named like MLflow's system metrics, one set per node
                figures = {f"system/node_{identity.node}/{name}": value for name, value in message["figures"].items()}
                self.metrics.put((current.max_step(), message["t"], figures))
            elif kind in ("checkpoint", "restored", "error", "started", "preempted", "diverged", "storage", "layout"):
                self.events.put(message)
            if newly_finished:
                self.events.put(current.finished)
        return None

    @staticmethod
    def _refusal(current: AttemptStatus, identity: Identity) -> str | None:
        """Why a bound connection may not speak for its rank in the current attempt, if it may not:
        the rank is outside the world, or another process has spoken for it (a worker keeps its
        pid for the whole attempt)."""
        if current.world_size is not None and identity.rank >= current.world_size:
            return f"attempt {current.attempt} has ranks 0-{current.world_size - 1}"
        known = current.ranks.get(identity.rank)
        if known is not None and known.pid != identity.pid:
            return f"rank {identity.rank} is process {known.pid} in attempt {current.attempt}, not {identity.pid}"
        return None
