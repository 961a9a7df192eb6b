"""Tracking writes that training never waits on: one writer thread, retries, and a bounded patience.

Every MLflow call of a run goes through one queue, in order, on one thread (the single writer a SQLite
store wants). A call the store refuses for a while (a database locked by another process, a full
disk) is retried with backoff; training goes on meanwhile, since metrics are queued without waiting.
A call the store refuses for good (a value MLflow cannot take) is dropped with a warning. When the
store has refused every write for longer than the patience, it is down: what is queued is dropped
(counted, never silently), each later call is tried once, and `fault()` says why, so the watcher ends
the attempt as INFRA with the workers' emergency checkpoint instead of training unrecorded.
"""

from __future__ import annotations

import logging
import posixpath
import queue
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("trainflow.tracking")

# MLflow's rules for a metric's name (mlflow.utils.validation): checked here, so one bad name costs
# that metric, not the batch it came in
MAX_METRIC_NAME_LENGTH = 250
METRIC_NAME = re.compile(r"^[/\w.\- :]*$")
# errors that say the call itself is wrong: retrying cannot help
REFUSED_FOR_GOOD = frozenset(
    {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "INVALID_STATE", "BAD_REQUEST"}
)
RETRY_DELAYS_S = (0.25, 0.5, 1.0, 2.0, 4.0)  # then every 4 s until the patience is spent
IDLE_EXIT_S = 30.0  # the writer thread ends after this long without a call, and starts again with the next
DOWN_RETRY_S = 10.0  # once the store is down, a call is tried at most this often; the rest are dropped


def metric_name_problem(name: str) -> str | None:
    """Why MLflow would refuse a metric of this name; None when it takes it."""
    if not name:
        return "an empty name"
    if len(name) > MAX_METRIC_NAME_LENGTH:
        return f"{len(name)} characters, MLflow takes at most {MAX_METRIC_NAME_LENGTH}"
    if not METRIC_NAME.match(name):
        return "MLflow takes only letters, digits, '_', '-', '.', ' ', ':' and '/' in a name"
    normal = posixpath.normpath(name)
    if normal != name or normal == "." or normal.startswith(("..", "/")):
        return "MLflow refuses a name that is not a plain relative path"
    return None


def refused_for_good(exc: BaseException) -> bool:
    """The store refused the call itself (bad value, unknown run), as opposed to being unavailable."""
    return getattr(exc, "error_code", None) in REFUSED_FOR_GOOD


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


@dataclass
class _Call:
    write: Callable[[], Any]
    what: str
    done: Future


class TrackingWrites:
    """The one thread that writes a run's tracking data, in the order the calls were made."""

    def __init__(self, patience_s: float):
        self.patience_s = patience_s
        self.dropped = 0  # calls never recorded: the store was down, or refused them
        self._failing_since: float | None = None  # first failure of the current outage
        self._last_error = ""
        self._down_tried_at = 0.0
        self._queue: queue.Queue[_Call] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()

    def submit(self, write: Callable[[], Any], what: str) -> Future:
        """Queue a call; its future holds the result, or None when it was dropped. Never raises."""
        call = _Call(write, what, Future())
        with self._starting:
            self._queue.put(call)
            if self._thread is None:  # the writer ends when idle, so a tracker left behind holds no thread
                self._thread = threading.Thread(target=self._serve, name="trainflow-tracking-writes", daemon=True)
                self._thread.start()
        return call.done

    def call(self, write: Callable[[], Any], what: str) -> Any:
        """Run a call in order with every other, and wait for it; None when it was dropped."""
        if threading.current_thread() is self._thread:  # a call made by a queued call
            return write()
        return self.submit(write, what).result()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued so far is written or dropped; False if `timeout_s` ran out first."""
        marker = self.submit(lambda: None, "flush")
        try:
            marker.result(timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    def fault(self) -> str | None:
        """Why the store is down (it refused every write for longer than the patience); None while it works."""
        since = self._failing_since
        if since is None or time.time() - since <= self.patience_s:
            return None
        return (
            f"the tracking store refused every write for {time.time() - since:.0f}s "
            f"(tracking.store_patience_s: {self.patience_s:g}s); last error: {self._last_error}"
        )

    def _serve(self) -> None:
        while True:
            try:
                call = self._queue.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._starting:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            try:
                call.done.set_result(self._run(call))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the call
                call.done.set_exception(exc)

    def _run(self, call: _Call) -> Any:
        attempt = 0
        while True:
            if self.fault() is not None and time.time() - self._down_tried_at < DOWN_RETRY_S:
                return self._drop(call, "the store is down")
            try:
                result = call.write()
            except Exception as exc:  # noqa: BLE001 - MLflow wraps the store's errors in several types
                if refused_for_good(exc):
                    log.warning("tracking: %s not recorded: %s", call.what, _describe(exc))
                    self.dropped += 1
                    return None
                self._failed(exc)
                if self.fault() is not None:
                    self._down_tried_at = time.time()
                    return self._drop(call, _describe(exc))
                delay = RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]
                attempt += 1
                time.sleep(delay)
                continue
            if self._failing_since is not None:
                log.warning("tracking: the store takes writes again after %.0fs", time.time() - self._failing_since)
            self._failing_since = None
            return result

    def _failed(self, exc: BaseException) -> None:
        self._last_error = _describe(exc)
        if self._failing_since is None:
            self._failing_since = time.time()
            log.warning(
                "tracking: the store refused a write (%s); retrying for up to %gs while training goes on",
                self._last_error,
                self.patience_s,
            )

    def _drop(self, call: _Call, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 100 == 0:
            log.error("tracking: %s not recorded (%d call(s) dropped so far): %s", call.what, self.dropped, why)
        return None
