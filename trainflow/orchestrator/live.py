"""The live parts of a run in this orchestrator process, found by the run's id.

Task results are plain records. What cannot be one lives here, under the run's id: the backend's
launcher (it holds the processes), the status channel (a listening socket), the MLflow client, the
checkpoint store's client (opened once, from the spec's URI), and each attempt's feed of checkpoint
commits from the watch to the flow, which snapshots them while the watch goes on. Provision opens a
run's parts and teardown closes them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from trainflow.backends import Launcher
from trainflow.checkpoint.storage import Storage
from trainflow.orchestrator.status import StatusServer
from trainflow.reporting.tracking import Tracker

_END = object()  # a feed's last item: the watch is over


@dataclass
class LiveParts:
    launcher: Launcher
    channel: StatusServer
    tracker: Tracker
    storage: Storage
    commit_feeds: dict[int, queue.Queue] = field(default_factory=dict)  # attempt -> its commits


_runs: dict[str, LiveParts] = {}
_lock = threading.Lock()


def open_run(run_id: str, parts: LiveParts) -> None:
    with _lock:
        if run_id in _runs:
            raise RuntimeError(f"run {run_id} is already live in this process")
        _runs[run_id] = parts


def parts_of(run_id: str) -> LiveParts:
    with _lock:
        return _runs[run_id]


def close_run(run_id: str) -> LiveParts | None:
    """Forget the run's parts; the caller closes them."""
    with _lock:
        return _runs.pop(run_id, None)


def _feed(run_id: str, attempt: int) -> queue.Queue:
    parts = parts_of(run_id)
    with _lock:
        return parts.commit_feeds.setdefault(attempt, queue.Queue())


def publish_commit(run_id: str, attempt: int, commit: dict) -> None:
    _feed(run_id, attempt).put(commit)


def end_commits(run_id: str, attempt: int) -> None:
    _feed(run_id, attempt).put(_END)


def commits(run_id: str, attempt: int) -> Iterator[dict]:
    """The attempt's commits as the watch passes them on, until its watch is over."""
    feed = _feed(run_id, attempt)
    yield from iter(feed.get, _END)
    parts = parts_of(run_id)
    with _lock:
        parts.commit_feeds.pop(attempt, None)
