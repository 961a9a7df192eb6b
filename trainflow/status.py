"""The orchestrator's side of the status channel: one TCP server, JSON lines from every worker.

It keeps, per rank, the last heartbeat, the last step and when that step was reached, and queues
metrics and events for the watch task. Messages of another attempt, or without the run's token,
are ignored.
"""

from __future__ import annotations

import json
import queue
import secrets
import socket
import socketserver
import threading
import time
from collections import deque
from dataclasses import dataclass, field

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
    started_at: float = field(default_factory=time.time)
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    finished: dict | None = None
    errors: list[dict] = field(default_factory=list)
    restored_step: int | None = None
    first_step_at: float | None = None
    preempted: dict | None = None
    diverged: dict | None = None

    def min_step(self) -> int:
        return min((r.step for r in self.ranks.values()), default=0)

    def max_step(self) -> int:
        return max((r.step for r in self.ranks.values()), default=0)


class StatusServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, advertise_host: str | None = None):
        self.token = secrets.token_hex(16)
        self.metrics: queue.Queue = queue.Queue()
        self.events: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._attempt = AttemptStatus(attempt=0)
        self._connections: set[socket.socket] = set()
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                server._serve(self.connection, self.rfile)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, port), Handler)
        bound_host, self.port = self._server.server_address[:2]
        self.host = advertise_host or bound_host  # where workers connect; may differ from 0.0.0.0
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,), daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def begin_attempt(self, attempt: int) -> None:
        with self._lock:
            self._attempt = AttemptStatus(attempt=attempt)

    def snapshot(self) -> AttemptStatus:
        """A consistent copy of what is known about the current attempt."""
        with self._lock:
            current = self._attempt
            return AttemptStatus(
                attempt=current.attempt,
                started_at=current.started_at,
                ranks={k: RankStatus(**{**vars(v), "compute_s": deque(v.compute_s)}) for k, v in current.ranks.items()},
                finished=dict(current.finished) if current.finished else None,
                errors=list(current.errors),
                restored_step=current.restored_step,
                first_step_at=current.first_step_at,
                preempted=current.preempted,
                diverged=current.diverged,
            )

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

    def _serve(self, conn: socket.socket, lines) -> None:
        try:
            hello = json.loads(lines.readline() or b"{}")
        except ValueError:
            return
        if hello.get("kind") != "hello" or not secrets.compare_digest(str(hello.get("token", "")), self.token):
            return
        with self._lock:
            self._connections.add(conn)
        try:
            self._receive(hello)
            for raw in lines:
                try:
                    self._receive(json.loads(raw))
                except ValueError:
                    continue
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.discard(conn)

    def _receive(self, message: dict) -> None:
        now = time.time()
        kind = message.get("kind")
        with self._lock:
            current = self._attempt
            if message.get("attempt") != current.attempt:
                return
            rank = int(message.get("rank", -1))
            status = current.ranks.setdefault(rank, RankStatus(rank=rank, node=int(message.get("node", -1))))
            status.last_seen = now
            status.pid = message.get("pid", status.pid)
            if kind == "progress":  # a batch of steps: one message per step would cost tiny steps dearly
                for entry in message.get("steps", []):
                    status.step = int(entry["step"])
                    status.step_time_s = entry.get("step_time_s")
                    if "compute_s" in entry:
                        status.compute_s.append(float(entry["compute_s"]))
                    if current.first_step_at is None:
                        current.first_step_at = min(now, float(entry.get("t", now)))
                status.progressed_at = now
            elif kind == "restored":
                current.restored_step = int(message["step"])
                status.step = current.restored_step
            elif kind == "finished":
                current.finished = message
            elif kind == "error":
                current.errors.append(message)
            elif kind == "preempted":
                if current.preempted is None or message.get("signalled"):
                    current.preempted = message  # prefer the rank that received the signal
            elif kind == "diverged":
                current.diverged = message
        if kind == "progress":
            for entry in message.get("steps", []):
                if "metrics" in entry:
                    self.metrics.put((entry["step"], entry.get("t", message["t"]), entry["metrics"]))
        elif kind == "resources":  # named like MLflow's system metrics, one set per node
            node = message.get("node")
            figures = {f"system/node_{node}/{name}": value for name, value in message.get("figures", {}).items()}
            self.metrics.put((current.max_step(), message["t"], figures))
        elif kind in ("checkpoint", "restored", "error", "finished", "started", "preempted", "diverged", "layout"):
            self.events.put(message)
