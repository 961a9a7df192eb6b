"""A finished report counts only when every rank sent it from its own connection, for the current
attempt, at the step it was seen at; a connection speaks only for the identity of its hello.
Real sockets against a real StatusServer."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from trainflow.contracts.status_protocol import PROTOCOL_VERSION
from trainflow.orchestrator.status import AttemptStatus, StatusServer

FORGED_HASH = "f" * 64


def wait_for(server: StatusServer, predicate: Callable[[AttemptStatus], bool], timeout: float = 10.0) -> AttemptStatus:
    deadline = time.monotonic() + timeout
    while True:
        snapshot = server.snapshot()
        if predicate(snapshot):
            return snapshot
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {snapshot}")
        time.sleep(0.02)


class Connection:
    """One worker's connection, written line by line as the reporter would."""

    def __init__(
        self, server: StatusServer, rank: int, attempt: int = 1, pid: int | None = None, token=None, replaces=()
    ):
        self.identity = {"rank": rank, "node": rank, "attempt": attempt, "pid": 1000 + rank if pid is None else pid}
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        token = server.token if token is None else token
        self.send("hello", token=token, version=PROTOCOL_VERSION, replaces=list(replaces))

    def send(self, kind: str, **fields) -> None:
        message = {**self.identity, "kind": kind, "t": time.time(), **fields}
        self.sock.sendall((json.dumps(message) + "\n").encode())

    def progress(self, step: int) -> None:
        self.send("progress", steps=[{"step": step, "step_time_s": 0.01}])

    def close(self) -> None:
        """As a worker ends its stream: no more lines, then the server's answers read to their end
        (closing with answers unread would reset the connection, and lose what it sent)."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            while self.sock.recv(65536):
                pass
        except OSError:
            pass
        self.sock.close()


@pytest.fixture
def server() -> Iterator[StatusServer]:
    server = StatusServer()
    server.begin_attempt(1, world_size=2)
    yield server
    server.close()


@pytest.fixture
def connect(server) -> Iterator[Callable[..., Connection]]:
    opened: list[Connection] = []

    def make(rank: int, **kwargs) -> Connection:
        opened.append(Connection(server, rank, **kwargs))
        return opened[-1]

    yield make
    for connection in opened:
        connection.close()


def wait_for_log(caplog, text: str, count: int = 1, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(text in r.getMessage() for r in caplog.records) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"no log line {text!r} within {timeout}s: {[r.getMessage() for r in caplog.records]}")
        time.sleep(0.02)


def seen_at(server: StatusServer, rank: int, step: int) -> AttemptStatus:
    return wait_for(server, lambda s: rank in s.ranks and s.ranks[rank].step == step)


def test_finished_once_every_rank_reported_with_rank_0s_hash(server, connect):
    rank0, rank1 = connect(0), connect(1)
    for worker in (rank0, rank1):
        worker.progress(10)
    rank0.send("finished", step=10, params_sha256="a" * 64, loss=0.5)
    rank0.progress(10)  # same connection, so the server has read the finished report once this shows
    seen_at(server, 0, 10)
    wait_for(server, lambda s: 0 in s.finished_ranks)
    assert server.snapshot().finished is None  # rank 1 has not finished yet
    rank1.send("finished", step=10)
    finished = wait_for(server, lambda s: s.finished is not None).finished
    assert (finished["rank"], finished["step"], finished["params_sha256"]) == (0, 10, "a" * 64)
    events = []
    while not server.events.empty():
        events.append(server.events.get_nowait().as_dict())
    assert [e["params_sha256"] for e in events if e["kind"] == "finished"] == ["a" * 64]  # one event, rank 0's


def test_a_connection_cannot_speak_for_another_rank(server, connect):
    rank0, rank1 = connect(0), connect(1)
    rank0.progress(10)
    rank1.progress(10)
    # rank 1's connection claims to be rank 0 and reports a forged hash, then rank 1 finishes honestly
    rank1.send("finished", rank=0, node=0, step=10, params_sha256=FORGED_HASH, loss=0.0)
    rank1.send("finished", step=10)
    wait_for(server, lambda s: 1 in s.finished_ranks)
    rank1.progress(10)
    seen_at(server, 1, 10)
    snapshot = server.snapshot()
    assert 0 not in snapshot.finished_ranks and snapshot.finished is None


def test_a_second_process_cannot_speak_for_a_rank_already_heard(server, connect):
    real = connect(0)
    real.progress(10)
    seen_at(server, 0, 10)
    impostor = connect(0, pid=4242)  # knows the token, says hello as rank 0
    impostor.send("finished", step=10, params_sha256=FORGED_HASH, loss=0.0)
    connect(1).progress(10)
    other = connect(1)
    other.send("finished", step=10)
    real.progress(11)  # the impostor's lines were read long before the real worker's next step
    snapshot = seen_at(server, 0, 11)
    assert snapshot.ranks[0].pid == 1000
    assert snapshot.finished is None and 0 not in snapshot.finished_ranks


def test_a_rank_outside_the_world_is_not_heard(server, connect, caplog):
    stranger = connect(5)
    stranger.progress(10)
    stranger.send("finished", step=10, params_sha256=FORGED_HASH)
    wait_for_log(caplog, "ignoring rank 5")
    stranger.send("finished", rank=1, step=10)  # claiming a rank of the world on its connection
    wait_for_log(caplog, "claims another rank")
    assert server.snapshot().ranks == {} and server.snapshot().finished_ranks == {}
    assert sum("ignoring rank 5" in r.getMessage() for r in caplog.records) == 1  # once per connection


def test_finished_at_a_step_the_orchestrator_never_saw_does_not_count(server, connect):
    rank0, rank1 = connect(0), connect(1)
    rank0.progress(3000)
    rank1.progress(3000)
    rank0.send("finished", step=6000, params_sha256=FORGED_HASH, loss=0.0)
    rank1.send("finished", step=6000)
    snapshot = wait_for(server, lambda s: len(s.finished_ranks) == 2)
    assert snapshot.finished is None
    # reports arriving ahead of the steps they speak of count once those steps are seen
    rank0.progress(6000)
    rank1.progress(6000)
    assert wait_for(server, lambda s: s.finished is not None).finished["step"] == 6000


def test_finished_of_an_earlier_attempt_does_not_count(server, connect, caplog):
    old0, old1 = connect(0), connect(1)
    old0.progress(10)
    old1.progress(10)
    seen_at(server, 1, 10)
    server.begin_attempt(2, world_size=2)
    old0.send("finished", step=10, params_sha256=FORGED_HASH)
    old1.send("finished", step=10)
    for old in (old0, old1):  # claiming the new attempt on a connection of the old one
        old.send("finished", attempt=2, step=10)
    new0, new1 = connect(0, attempt=2, pid=2000), connect(1, attempt=2, pid=2001)
    new0.progress(4)
    new1.progress(4)
    seen_at(server, 1, 4)
    wait_for_log(caplog, "claims another attempt", count=2)  # so every line before those was read
    snapshot = server.snapshot()
    assert snapshot.finished is None and snapshot.finished_ranks == {}


def test_a_closed_connection_is_counted_only_once_everything_it_sent_is_applied(server):
    """What the watcher waits on before it decides an exit: an exited worker's last reports count."""
    server.begin_attempt(1, world_size=2)
    first = Connection(server, rank=0)
    wait_for(server, lambda s: 0 in s.ranks)
    assert server.open_connections([0]) == 1 and server.open_connections([1]) == 0
    for step in range(1, 200):
        first.progress(step)
    first.send("error", type="RuntimeError", message="boom")
    first.close()
    deadline = time.monotonic() + 10
    while server.open_connections([0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    snapshot = server.snapshot()  # no waiting on the step itself: the count alone says it is in
    assert server.open_connections([0]) == 0
    assert snapshot.ranks[0].step == 199 and snapshot.errors[0]["message"] == "boom"


def drain(q) -> list:
    items = []
    while not q.empty():
        item = q.get_nowait()
        items.append(item.as_dict() if hasattr(item, "as_dict") else item)
    return items


def test_what_an_attempt_sent_after_its_watch_ended_is_not_the_next_attempts(server, connect):
    """The ranks of a released attempt report their deaths (a DataLoader worker gone, a peer's closed
    connection) while their attempt is still the channel's: the next attempt's watcher must not log
    them or count their steps as its own."""
    old0 = connect(0)
    old0.progress(20)
    old0.send("error", type="RuntimeError", message="DataLoader worker exited unexpectedly")
    old0.progress(21)
    seen_at(server, 0, 21)  # so the error before it is queued too
    assert [e["kind"] for e in drain(server.events)] == ["error"]  # the current attempt's, while it is
    old0.send("error", type="RuntimeError", message="Connection closed by peer")
    old0.progress(22)
    seen_at(server, 0, 22)
    server.begin_attempt(2, world_size=2)
    assert server.events.empty() and server.steps.empty() and server.metrics.empty()
    new0 = connect(0, attempt=2, pid=2000)
    new0.send("error", type="ValueError", message="the new attempt's own")
    new0.progress(3)
    seen_at(server, 0, 3)
    assert [(e["attempt"], e["message"]) for e in drain(server.events)] == [(2, "the new attempt's own")]
    assert [report.step for report in drain(server.steps)] == [3]


def test_a_process_started_in_place_of_a_dead_one_speaks_for_its_rank_from_then_on(server, connect):
    first = connect(0)
    first.progress(10)
    seen_at(server, 0, 10)
    replacement = connect(0, pid=2000, replaces=[1000])  # its node's agent started it as rank 0's died
    replacement.progress(11)
    assert seen_at(server, 0, 11).ranks[0].pid == 2000
    first.progress(12)  # the dead one's last lines, read late, no longer speak for the rank
    replacement.progress(13)
    snapshot = seen_at(server, 0, 13)
    assert snapshot.ranks[0].pid == 2000


def test_a_process_may_replace_only_the_process_its_rank_is(server, connect):
    real = connect(0)
    real.progress(10)
    seen_at(server, 0, 10)
    impostor = connect(0, pid=4242, replaces=[999])  # not rank 0's process
    impostor.progress(50)
    real.progress(11)
    snapshot = seen_at(server, 0, 11)
    assert snapshot.ranks[0].pid == 1000 and snapshot.ranks[0].step == 11
