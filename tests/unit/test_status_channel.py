"""trainflow.orchestrator.status.StatusServer with trainflow.runtime.reporter.StatusReporter over loopback TCP."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from tests.unit.test_status_identity import Connection
from trainflow.contracts.status_protocol import Error, Finished, Progress, Restored, Started, StepEntry
from trainflow.orchestrator.status import AttemptStatus, StatusServer
from trainflow.runtime.reporter import StatusReporter


def progress(step: int, loss: float | None = None) -> Progress:
    return Progress(steps=[StepEntry(step=step, step_time_s=0.01, metrics=None if loss is None else {"loss": loss})])


def wait_for(server: StatusServer, predicate: Callable[[AttemptStatus], bool], timeout: float = 5.0) -> AttemptStatus:
    deadline = time.monotonic() + timeout
    while True:
        snapshot = server.snapshot()
        if predicate(snapshot):
            return snapshot
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {snapshot}")
        time.sleep(0.02)


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def server(stack) -> StatusServer:
    server = StatusServer()
    stack.callback(server.close)  # callbacks run last-in first-out: reporters close before the server
    server.begin_attempt(1)
    return server


@pytest.fixture
def reporter(server, stack) -> Callable[..., StatusReporter]:
    def make(rank: int = 0, attempt: int = 1, token: str | None = None, interval: float = 0.1) -> StatusReporter:
        reporter = StatusReporter(
            server.address,
            server.token if token is None else token,
            identity={"rank": rank, "node": rank, "attempt": attempt, "pid": 1000 + rank},
            heartbeat_interval_s=interval,
            orchestrator_timeout_s=30,
        )
        stack.callback(reporter.close)
        return reporter

    return make


def test_progress_reaches_the_server(server, reporter):
    worker = reporter(rank=0)
    worker.send(progress(3, loss=1.0))
    snapshot = wait_for(server, lambda s: 0 in s.ranks and s.ranks[0].step == 3)
    rank = snapshot.ranks[0]
    assert (rank.node, rank.pid, rank.step_time_s) == (0, 1000, 0.01)
    assert rank.progressed_at > 0 and snapshot.first_step_at is not None
    report = server.steps.get(timeout=5)
    assert (report.rank, report.step, report.loss, report.metrics) == (0, 3, 1.0, {"loss": 1.0})
    assert abs(report.t - time.time()) < 60


def test_close_delivers_what_is_queued(server, reporter):
    server.begin_attempt(1, world_size=1)
    worker = reporter(rank=0, interval=5.0)
    for step in (1, 2, 3):
        worker.send(progress(step))
    worker.send(Finished(step=3))
    worker.close()
    snapshot = wait_for(server, lambda s: s.finished is not None)
    assert snapshot.ranks[0].step == 3 and snapshot.finished["step"] == 3
    assert isinstance(server.events.get(timeout=5).message, Finished)


def test_events_and_errors_are_recorded(server, reporter):
    worker = reporter(rank=1)
    worker.send(Restored(step=40))
    worker.send(Error(step=41, type="ValueError", message="bad"))
    snapshot = wait_for(server, lambda s: s.errors)
    assert snapshot.restored_step == 40 and snapshot.ranks[1].step == 40
    assert snapshot.errors[0]["type"] == "ValueError" and snapshot.errors[0]["rank"] == 1
    assert [type(server.events.get(timeout=5).message) for _ in range(2)] == [Restored, Error]


def test_wrong_token_is_ignored(server, reporter):
    intruder = reporter(rank=0, token="not-the-token")
    intruder.send(progress(9, loss=0.0))
    honest = reporter(rank=1)
    honest.send(progress(1))
    wait_for(server, lambda s: 1 in s.ranks and s.ranks[1].step == 1)
    time.sleep(0.3)  # give the intruder every chance to show up
    assert 0 not in server.snapshot().ranks
    assert server.steps.get(timeout=5).rank == 1
    with pytest.raises(queue.Empty):
        server.steps.get_nowait()


def test_messages_of_another_attempt_are_ignored(server):
    worker = Connection(server, rank=0)  # as an older worker wrote them: its identity in every message
    # one connection, so the server reads these in order
    worker.send("progress", attempt=2, steps=[{"step": 5, "step_time_s": 0.01, "metrics": {"loss": 9.0}}])
    worker.send("error", attempt=2, step=5, type="ValueError", message="stale")
    worker.send("progress", steps=[{"step": 3, "step_time_s": 0.01, "metrics": {"loss": 1.0}}])
    snapshot = wait_for(server, lambda s: 0 in s.ranks and s.ranks[0].step == 3)
    assert snapshot.errors == []
    assert server.steps.get(timeout=5).step == 3
    with pytest.raises(queue.Empty):
        server.steps.get_nowait()
    worker.close()


def test_reporter_of_a_later_attempt_is_ignored_until_it_begins(server, reporter):
    late = reporter(rank=0, attempt=2)
    late.send(progress(5))
    current = reporter(rank=1, attempt=1)
    current.send(progress(1))
    wait_for(server, lambda s: 1 in s.ranks)
    time.sleep(0.3)
    assert 0 not in server.snapshot().ranks
    server.begin_attempt(2)
    snapshot = wait_for(server, lambda s: 0 in s.ranks)  # its heartbeats now count
    assert snapshot.attempt == 2 and 1 not in snapshot.ranks


def test_heartbeats_update_last_seen_without_progress(server, reporter):
    reporter(rank=0, interval=0.1)
    first = wait_for(server, lambda s: 0 in s.ranks).ranks[0].last_seen
    snapshot = wait_for(server, lambda s: s.ranks[0].last_seen > first)
    rank = snapshot.ranks[0]
    assert rank.step == 0 and rank.progressed_at == 0.0
    assert snapshot.first_step_at is None
    with pytest.raises(queue.Empty):
        server.steps.get_nowait()


def test_begin_attempt_forgets_the_previous_one(server, reporter):
    worker = reporter(rank=0, interval=5.0)
    worker.send(progress(3))
    wait_for(server, lambda s: 0 in s.ranks and s.ranks[0].step == 3)
    server.begin_attempt(2)
    snapshot = server.snapshot()
    assert snapshot.attempt == 2 and snapshot.ranks == {} and snapshot.first_step_at is None


def test_snapshot_is_a_copy(server, reporter):
    worker = reporter(rank=0, interval=5.0)
    worker.send(progress(3))
    snapshot = wait_for(server, lambda s: 0 in s.ranks and s.ranks[0].step == 3)
    snapshot.ranks[0].step = 99
    snapshot.errors.append({"x": 1})
    again = server.snapshot()
    assert again.ranks[0].step == 3 and again.errors == []


def test_min_and_max_step():
    status = AttemptStatus(attempt=1)
    assert (status.min_step(), status.max_step()) == (0, 0)


def test_the_attempt_keeps_the_slowest_ranks_start_up_points(server, reporter):
    server.begin_attempt(1, world_size=2)
    first, second = reporter(rank=0), reporter(rank=1)
    first.send(Started(world_size=2, process_started_at=10.0, imported_at=12.0, rendezvous_at=13.0))
    second.send(Started(world_size=2, process_started_at=10.5, imported_at=11.5, rendezvous_at=13.2))
    first.send(Restored(step=20))
    snapshot = wait_for(server, lambda s: s.milestones.rendezvous_at == 13.2 and s.milestones.restored_at is not None)
    marks = snapshot.milestones
    assert (marks.process_started_at, marks.imported_at, marks.rendezvous_at) == (10.5, 12.0, 13.2)
    assert marks.restored_at <= time.time()  # when rank 0 said it had restored
