"""The worker's side of the status channel: heartbeats, progress, metrics and events.

A background thread owns the socket so training never blocks on the orchestrator, and keeps
sending heartbeats while the main thread is busy (or stuck in a collective): heartbeats without
progress read as a hang, silence reads as a lost node. If the orchestrator stays unreachable for
`orchestrator_timeout_s` the worker exits, so an orchestrator crash leaves no orphans behind.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import sys
import threading
import time

from trainflow.runtime.exit_codes import ORCHESTRATOR_LOST as EXIT_ORCHESTRATOR_LOST
_STOP = object()


class StatusReporter:
    def __init__(
        self,
        address: str,
        token: str,
        identity: dict,
        heartbeat_interval_s: float,
        orchestrator_timeout_s: float,
    ):
        host, _, port = address.rpartition(":")
        self._address = (host, int(port))
        self._hello = {"kind": "hello", "token": token, **identity}
        self._identity = identity
        self._interval = heartbeat_interval_s
        self._timeout = orchestrator_timeout_s
        self._queue: queue.Queue = queue.Queue()
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="trainflow-status", daemon=True)
        self._thread.start()

    def send(self, kind: str, **fields) -> None:
        self._queue.put({"kind": kind, "t": time.time(), **fields})

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then stop."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=max(self._interval, 1.0))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(_encode({**self._hello, "t": time.time()}))
        return sock

    def _run(self) -> None:
        unreachable_since: float | None = None
        pending: dict | None = None
        while True:
            if pending is None:
                try:
                    pending = self._queue.get(timeout=self._interval)
                except queue.Empty:
                    pending = {"kind": "heartbeat", "t": time.time()}
            if pending is _STOP:
                self._disconnect()
                return
            try:
                if self._sock is None:
                    self._sock = self._connect()
                self._sock.sendall(_encode({**self._identity, **pending}))
                pending = None
                unreachable_since = None
            except OSError:
                self._disconnect()
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > self._timeout:
                    print(
                        f"trainflow: orchestrator unreachable for {self._timeout:.0f}s, stopping this worker",
                        file=sys.stderr,
                        flush=True,
                    )
                    os._exit(EXIT_ORCHESTRATOR_LOST)
                if pending.get("kind") == "heartbeat":
                    pending = None  # a stale heartbeat is worth nothing; send a fresh one later
                time.sleep(min(self._interval, 0.5))

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


def _encode(message: dict) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()
