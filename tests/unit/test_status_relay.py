"""A node's relay between its ranks and the orchestrator: one stream per node, the ranks' steps
summed, their events verbatim, a rank of another node refused, a silent rank still named; and a
frozen orchestrator noticed by the workers. Real sockets, a real StatusServer and NodeRelay."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator

import pytest

from trainflow.contracts import status_protocol as wire
from trainflow.contracts.exit_codes import ORCHESTRATOR_LOST
from trainflow.orchestrator.attempt_metrics import AttemptMetrics
from trainflow.orchestrator.status import AttemptStatus, StatusServer
from trainflow.relay.relay import NodeRelay
from trainflow.runtime.reporter import StatusReporter


def wait_for(server: StatusServer, predicate: Callable[[AttemptStatus], bool], timeout: float = 30.0) -> AttemptStatus:
    deadline = time.monotonic() + timeout
    while True:
        snapshot = server.snapshot()
        if predicate(snapshot):
            return snapshot
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {snapshot}")
        time.sleep(0.05)


@pytest.fixture
def server() -> Iterator[StatusServer]:
    server = StatusServer()
    server.begin_attempt(1, world_size=4)
    yield server
    server.close()


@pytest.fixture
def relay(server, tmp_path) -> Iterator[NodeRelay]:
    relay = NodeRelay(server.address, server.token, node=0, attempt=1, heartbeat_interval_s=0.1, scratch=str(tmp_path))
    yield relay
    relay.close(timeout=2)


def rank(relay: NodeRelay, server: StatusServer, number: int) -> StatusReporter:
    return StatusReporter(
        relay.address,
        server.token,
        {"rank": number, "node": 0, "attempt": 1, "pid": 100 + number},
        heartbeat_interval_s=0.1,
        orchestrator_timeout_s=30,
    )


def test_a_nodes_ranks_reach_the_orchestrator_as_one_stream_with_their_steps_summed(server, relay):
    ranks = [rank(relay, server, n) for n in range(4)]
    try:
        for step in (1, 2):
            for n, worker in enumerate(ranks):
                metrics = {"loss": 1.0 * step, "lr": 0.1} if n == 0 else None
                worker.send(
                    wire.Progress(
                        steps=[
                            wire.StepEntry(
                                step=step,
                                t=time.time(),
                                step_time_s=0.01,
                                compute_s=0.01,
                                metrics=metrics,
                                loss=None if n == 0 else float(n + step),
                            )
                        ]
                    )
                )
        for n, worker in enumerate(ranks):
            worker.send(wire.Finished(step=2, loss=float(n), params_sha256="ab" * 32 if n == 0 else None))
        ranks[3].send(wire.Error(type="ValueError", message="verbatim", step=2))
        finished = wait_for(server, lambda s: s.finished is not None and s.errors)
        assert {r.rank: (r.node, r.pid, r.step) for r in finished.ranks.values()} == {
            n: (0, 100 + n, 2) for n in range(4)
        }
        assert finished.finished["params_sha256"] == "ab" * 32 and finished.finished["loss"] == 1.5
        assert (finished.errors[0]["rank"], finished.errors[0]["message"]) == (3, "verbatim")
        assert server.open_connections([0]) == 1  # one stream for the node, not one per rank
        metrics = AttemptMetrics(4, 0.0, (), None)
        while not server.steps.empty():
            metrics.add_step(server.steps.get_nowait())
        losses = {(key, step): value for key, value, step, _ in metrics.take() if key == "loss"}
        # step 1: rank 0's 1.0 and ranks 1-3's 2, 3, 4; step 2: 2.0 and 3, 4, 5
        assert losses == {("loss", 1): 2.5, ("loss", 2): 3.5}
    finally:
        for worker in ranks:
            worker.close()


def test_a_nodes_resource_figures_pass_the_relay_as_system_metrics(server, relay):
    worker = rank(relay, server, 0)
    try:
        worker.send(wire.Resources(figures={"cpu_percent": 42.0, "memory_used_MB": 512.0}))
        deadline = time.monotonic() + 30
        while server.metrics.empty():
            assert time.monotonic() < deadline, "no system metrics from the node"
            time.sleep(0.05)
        _, _, named = server.metrics.get_nowait()
        assert named == {"system/node_0/cpu_percent": 42.0, "system/node_0/memory_used_MB": 512.0}
    finally:
        worker.close()


def test_a_rank_of_another_node_or_version_is_refused_by_the_relay(server, relay):
    for hello, why in [
        (wire.Hello(token=server.token, rank=9, node=1, attempt=1, pid=9, version=wire.PROTOCOL_VERSION), "node 1"),
        (wire.Hello(token=server.token, rank=1, node=0, attempt=1, pid=9, version=1), "version 1"),
    ]:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(relay.address.removeprefix("unix:"))
            sock.sendall(wire.encode(hello))
            refused = wire.decode(sock.makefile("rb").readline())
            assert isinstance(refused, wire.Refused) and why in refused.reason
    with socket.socket(socket.AF_UNIX) as sock:  # the wrong token: closed, nothing said
        sock.connect(relay.address.removeprefix("unix:"))
        sock.sendall(wire.encode(wire.Hello(token="x", rank=1, node=0, attempt=1, version=wire.PROTOCOL_VERSION)))
        assert sock.recv(100) == b""
    time.sleep(0.5)
    assert set(server.snapshot().ranks) == set()


def test_a_silent_rank_behind_a_live_relay_is_named(server, relay):
    talking = rank(relay, server, 0)
    with socket.socket(socket.AF_UNIX) as frozen:  # says hello, then nothing ever again
        frozen.connect(relay.address.removeprefix("unix:"))
        frozen.sendall(
            wire.encode(wire.Hello(token=server.token, rank=1, node=0, attempt=1, pid=7, version=wire.PROTOCOL_VERSION))
        )
        try:
            wait_for(server, lambda s: set(s.ranks) == {0, 1})
            deadline = time.monotonic() + 30
            while True:
                summary = server.summary()
                if summary.silent_rank == 1 and time.time() - summary.silent_since > 1.0:
                    break
                assert time.monotonic() < deadline, summary
                time.sleep(0.05)
            snapshot = server.snapshot()
            assert snapshot.ranks[0].last_seen > snapshot.ranks[1].last_seen  # rank 0 heartbeats on
        finally:
            talking.close()


ORCHESTRATOR = textwrap.dedent("""
    import json, sys
    from trainflow.orchestrator.status import StatusServer
    server = StatusServer()
    server.begin_attempt(1, world_size=1)
    print(json.dumps({"address": server.address, "token": server.token}), flush=True)
    for command in sys.stdin:
        print(json.dumps(sorted(server.snapshot().ranks)), flush=True)
""")

WORKER = textwrap.dedent("""
    import sys, time
    from trainflow.relay.relay import NodeRelay
    from trainflow.runtime.reporter import StatusReporter
    address, token, through_relay = sys.argv[1], sys.argv[2], sys.argv[3] == "relay"
    if through_relay:
        relay = NodeRelay(address, token, node=0, attempt=1, heartbeat_interval_s=0.2, scratch=sys.argv[5])
        address = relay.address
    StatusReporter(address, token, {"rank": 0, "node": 0, "attempt": 1, "pid": 1}, heartbeat_interval_s=0.2,
                   orchestrator_timeout_s=float(sys.argv[4]))
    time.sleep(600)
""")


@pytest.mark.parametrize("path", ["relay", "direct"])
def test_a_frozen_orchestrator_stops_its_workers_after_the_orchestrator_timeout(path, tmp_path):
    orchestrator = subprocess.Popen(
        [sys.executable, "-c", ORCHESTRATOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    worker = None
    try:
        channel = json.loads(orchestrator.stdout.readline())
        timeout_s = 5.0
        worker = subprocess.Popen(
            [sys.executable, "-c", WORKER, channel["address"], channel["token"], path, str(timeout_s), str(tmp_path)],
            stderr=subprocess.PIPE,
            text=True,
        )

        def ranks() -> list[int]:
            orchestrator.stdin.write("ranks\n")
            orchestrator.stdin.flush()
            return json.loads(orchestrator.stdout.readline())

        deadline = time.monotonic() + 60
        while ranks() != [0]:
            assert time.monotonic() < deadline and worker.poll() is None, "the worker reaches the orchestrator"
            time.sleep(0.1)
        time.sleep(2 * timeout_s)
        assert worker.poll() is None, "a worker whose orchestrator answers keeps running"
        os.kill(orchestrator.pid, signal.SIGSTOP)  # frozen: its sockets still accept bytes, nothing answers
        frozen_at = time.monotonic()
        code = worker.wait(timeout=120)
        assert code == ORCHESTRATOR_LOST and time.monotonic() - frozen_at >= timeout_s - 1
        assert "no answer from the orchestrator" in worker.stderr.read()
    finally:
        os.kill(orchestrator.pid, signal.SIGCONT)
        for proc in (worker, orchestrator):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        orchestrator.stdin.close()


def test_a_rank_process_started_in_place_of_a_dead_one_reaches_the_orchestrator_through_the_relay(server, relay):
    first = rank(relay, server, 0)
    first.send(wire.Progress(steps=[wire.StepEntry(step=5)]))
    wait_for(server, lambda s: 0 in s.ranks and s.ranks[0].step == 5)
    # the replacement says hello before the relay has read the dead one's end
    replacement = StatusReporter(
        relay.address,
        server.token,
        {"rank": 0, "node": 0, "attempt": 1, "pid": 555, "replaces": [100]},
        heartbeat_interval_s=0.1,
        orchestrator_timeout_s=30,
    )
    replacement.send(wire.Progress(steps=[wire.StepEntry(step=6)]))
    snapshot = wait_for(server, lambda s: s.ranks[0].step == 6)
    assert snapshot.ranks[0].pid == 555
    first.close()
    replacement.close()
