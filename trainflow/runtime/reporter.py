"""The worker's side of the status channel: heartbeats, progress, metrics and events.

A rank speaks to its node's relay (`TRAINFLOW_STATUS_RELAY`, set by the node's agent), or to the
orchestrator itself where there is none; either answers what it reads (status_protocol.py). A
background thread owns the socket so training never blocks on the channel, and keeps sending
heartbeats while the main thread is busy (or stuck in a collective): heartbeats without progress
read as a hang, silence reads as a lost node. If nothing answers for `orchestrator_timeout_s` (the
orchestrator is gone, unreachable or frozen) the worker exits, so it leaves no orphans behind.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable

from trainflow.contracts.status_protocol import PROTOCOL_VERSION, Heartbeat, Hello, encode
from trainflow.relay.link import StreamLink
from trainflow.runtime.exit_codes import ORCHESTRATOR_LOST as EXIT_ORCHESTRATOR_LOST
from trainflow.worker_config import RELAY_ENV

_STOP = object()


def status_address(orchestrator: str) -> str:
    """Where this rank reports: its node's relay where the agent runs one, else the orchestrator."""
    return os.environ.get(RELAY_ENV) or orchestrator


class StatusReporter:
    def __init__(
        self,
        address: str,
        token: str,
        identity: dict,
        heartbeat_interval_s: float,
        orchestrator_timeout_s: float,
        on_lost: Callable[[str], None] | None = None,
    ):
        """`on_lost(message)` runs when the orchestrator stops answering or refuses this worker;
        by default the worker says why on stderr and exits ORCHESTRATOR_LOST."""
        self._on_lost = on_lost or _exit_lost
        self._interval = heartbeat_interval_s
        self._timeout = orchestrator_timeout_s
        self._queue: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._link = StreamLink(
            address,
            lambda: Hello(token=token, version=PROTOCOL_VERSION, **identity),
            connect_timeout_s=max(heartbeat_interval_s, 1.0),
            on_refused=self._refused,
        )
        self._thread = threading.Thread(target=self._run, name="trainflow-status", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watch_answers, name="trainflow-status-watch", daemon=True).start()

    def send(self, message: object) -> None:
        """Queue one message of status_protocol (a Progress, a Checkpoint...)."""
        self._queue.put(message)

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then stop."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._closed.set()

    def _run(self) -> None:
        pending: object | None = None
        while True:
            if pending is None:
                try:
                    pending = self._queue.get(timeout=self._interval)
                except queue.Empty:
                    pending = Heartbeat()
            if pending is _STOP:
                self._link.close(drain_s=2.0)
                return
            if self._link.send(encode(pending)):
                pending = None
                continue
            if isinstance(pending, Heartbeat):
                pending = None  # a stale heartbeat is worth nothing; send a fresh one later
            time.sleep(min(max(self._link.retry_in(), 0.05), self._interval))

    def _watch_answers(self) -> None:
        while not self._closed.wait(min(self._interval, 1.0)):
            silent = time.monotonic() - self._link.answered_at
            if silent > self._timeout:
                self._closed.set()
                self._on_lost(
                    f"no answer from the orchestrator for {silent:.0f}s "
                    f"(fault_tolerance.orchestrator_timeout_s: {self._timeout:g}s), stopping this worker"
                )

    def _refused(self, reason: str) -> None:
        self._closed.set()
        self._on_lost(f"the status channel refused this worker: {reason}")


def _exit_lost(message: str) -> None:
    print(f"trainflow: {message}", file=sys.stderr, flush=True)
    os._exit(EXIT_ORCHESTRATOR_LOST)
