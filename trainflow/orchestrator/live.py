"""The live parts of one run in this orchestrator process, owned by the flow that runs it.

Task results are plain records. What cannot be one is held by the run's `LiveRun`: the backend's
launcher (it holds the processes), the status channel (a listening socket), the MLflow client, the
checkpoint store's client (opened once, from the spec's URI), and each attempt's feed of checkpoint
commits from the watch to the flow, which snapshots them while the watch goes on. The flow opens it
with `with`, provision fills it, and whatever happens the flow's leaving it closes the channel and
ends every feed, so nothing outlives the flow and nobody waits on a feed nothing will end.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from trainflow.backends import Launcher
from trainflow.checkpoint.storage import Storage
from trainflow.orchestrator.status import StatusServer
from trainflow.reporting.tracking import Tracker

_END = object()  # a feed's last item: nothing more will come


class CommitFeed:
    """One attempt's checkpoint commits, from its watch to the flow, in the order they came."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._ended = threading.Event()

    def publish(self, commit: dict) -> None:
        self._queue.put(commit)

    def end(self) -> None:
        """Nothing more will come (idempotent): what was published is still read, then the feed ends."""
        if not self._ended.is_set():
            self._ended.set()
            self._queue.put(_END)

    def end_when_done(self, future) -> None:
        """End the feed when `future` (the watch's) is done, whether it returned, raised or was cancelled."""
        future.add_done_callback(lambda _: self.end())

    def __iter__(self) -> Iterator[dict]:
        return iter(self._queue.get, _END)


class LiveRun:
    """A run's live parts, a context the flow owns: `with LiveRun(run_id) as live:`. A plain class,
    not a dataclass, so Prefect does not walk into it when a task takes it."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self._parts: tuple[Launcher, StatusServer, Tracker, Storage] | None = None
        self._feeds: dict[int, CommitFeed] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"LiveRun({self.run_id!r}, {'open' if self._parts else 'closed' if self._closed else 'empty'})"

    def __enter__(self) -> LiveRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self, launcher: Launcher, channel: StatusServer, tracker: Tracker, storage: Storage) -> None:
        """Hold what provision opened; it is closed with the run."""
        with self._lock:
            if self._parts is not None or self._closed:
                raise RuntimeError(f"run {self.run_id}: its live parts were already opened")
            self._parts = (launcher, channel, tracker, storage)

    def _part(self, index: int):
        parts = self._parts
        if parts is None:
            raise RuntimeError(f"run {self.run_id} has no live parts: it was not provisioned, or it is over")
        return parts[index]

    @property
    def launcher(self) -> Launcher:
        return self._part(0)

    @property
    def channel(self) -> StatusServer:
        return self._part(1)

    @property
    def tracker(self) -> Tracker:
        return self._part(2)

    @property
    def storage(self) -> Storage:
        return self._part(3)

    def commit_feed(self, attempt: int) -> CommitFeed:
        """The attempt's feed of commits (the same one for the watch that writes and the flow that reads)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"run {self.run_id} is over: no feed for attempt {attempt}")
            return self._feeds.setdefault(attempt, CommitFeed())

    def close(self) -> None:
        """End every feed and close the status channel, once; the launcher's processes are teardown's."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            feeds, self._feeds = list(self._feeds.values()), {}
            parts = self._parts
        for feed in feeds:
            feed.end()
        if parts is not None:
            parts[1].close()
