"""The status channel before authentication: a deadline for the hello, a bound on every line, a
cap on connections still waiting for their hello, and malformed input dropped with one log line.
Real sockets against a real StatusServer (in a process of its own where memory is measured)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from trainflow.contracts.status_protocol import PROTOCOL_VERSION, Progress, StepEntry
from trainflow.orchestrator.status import StatusServer
from trainflow.orchestrator.status_limits import ChannelLimits
from trainflow.runtime.reporter import StatusReporter

MiB = 1 << 20


def eventually(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end has closed this connection (without waiting for it)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def idle_connection(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


@pytest.fixture
def make_server() -> Iterator[Callable[..., StatusServer]]:
    servers: list[StatusServer] = []

    def make(**limits) -> StatusServer:
        servers.append(StatusServer(limits=ChannelLimits(**limits)))
        servers[-1].begin_attempt(1, world_size=1)
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def serves_a_real_worker(server: StatusServer, step: int = 7) -> bool:
    reporter = StatusReporter(
        server.address,
        server.token,
        {"rank": 0, "node": 0, "attempt": 1, "pid": 100},
        heartbeat_interval_s=0.1,
        orchestrator_timeout_s=30,
    )
    try:
        reporter.send(Progress(steps=[StepEntry(step=step, step_time_s=0.01)]))
        eventually(
            lambda: 0 in server.snapshot().ranks and server.snapshot().ranks[0].step == step,
            "the real worker's progress reaches the server",
        )
        return True
    finally:
        reporter.close()


def test_idle_connections_are_closed_after_the_hello_timeout(make_server, caplog):
    server = make_server(hello_timeout_s=1.0)
    idle = [idle_connection(server.port) for _ in range(5)]
    try:
        eventually(lambda: all(closed_by_peer(s) for s in idle), "the server closes every idle connection")
    finally:
        for sock in idle:
            sock.close()
    assert sum("no hello within" in r.getMessage() for r in caplog.records) == 5
    assert serves_a_real_worker(server)


def test_connections_waiting_for_a_hello_are_capped_per_peer_and_overall(make_server):
    server = make_server(hello_timeout_s=120.0, max_pending_per_peer=8, max_pending=12)
    baseline = threading.active_count()
    idle = [idle_connection(server.port) for _ in range(20)]
    idle += [idle_connection(server.port, source="127.0.0.2") for _ in range(10)]
    try:
        # the oldest are dropped to make room: 8 from one address, then 12 in all
        eventually(lambda: sum(closed_by_peer(s) for s in idle) == 30 - 12, "the server drops the oldest 18")
        still_open = [i for i, sock in enumerate(idle) if not closed_by_peer(sock)]
        assert len([i for i in still_open if i < 20]) <= 8 and len(still_open) == 12
        eventually(lambda: threading.active_count() <= baseline + 12, "one handler thread per waiting connection")
        # a real worker still gets in (and the newest waiting connection stays)
        assert serves_a_real_worker(server)
        assert not closed_by_peer(idle[-1])
    finally:
        for sock in idle:
            sock.close()


def test_default_caps_bound_the_threads_of_many_idle_connections(make_server):
    server = make_server(hello_timeout_s=120.0)
    baseline = threading.active_count()
    idle = [idle_connection(server.port) for _ in range(200)]
    try:
        cap = server.limits.max_pending_per_peer
        eventually(lambda: sum(closed_by_peer(s) for s in idle) == 200 - cap, "all but the newest are dropped")
        eventually(lambda: threading.active_count() <= baseline + cap, "threads bounded by the cap")
        assert serves_a_real_worker(server)
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize(
    "line",
    [
        b"[1, 2, 3]",
        b'"hello"',
        b"42",
        b"null",
        b"\xff\xfe not utf-8",
        b"{not json",
        b'{"kind": "hello", "token": TOKEN, "rank": "0", "node": 0, "attempt": 1}',
        b'{"kind": "hello", "token": TOKEN, "rank": 0, "node": 0, "attempt": true}',
        b'{"kind": "hello", "token": TOKEN, "rank": 0, "node": 0, "attempt": 1, "t": "soon"}',
        b'{"kind": "progress", "rank": 0, "node": 0, "attempt": 1, "t": 1.0, "steps": []}',
        b'{"kind": "hello", "token": "wrong", "rank": 0, "node": 0, "attempt": 1}',
    ],
)
def test_a_malformed_hello_is_dropped_with_one_log_line(make_server, caplog, capsys, line):
    server = make_server()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(line.replace(b"TOKEN", json.dumps(server.token).encode()) + b"\n")
        eventually(lambda: closed_by_peer(sock), "the server closes the connection")
    dropped = [r for r in caplog.records if "dropped a connection" in r.getMessage()]
    assert len(dropped) == 1, [r.getMessage() for r in caplog.records]
    assert server.snapshot().ranks == {}
    assert serves_a_real_worker(server)
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "message",
    [
        [1, 2],
        {"kind": "progress", "t": 1.0, "steps": "many"},
        {"kind": "progress", "t": 1.0, "steps": [{"step": "7"}]},
        {"kind": "progress", "t": 1.0, "steps": [{"step": 7, "metrics": {"loss": "low"}}]},
        {"kind": "restored", "t": 1.0, "step": None},
        {"kind": "finished", "t": 1.0, "step": 7.5},
        {"kind": "resources", "t": 1.0, "figures": [1]},
        {"kind": "checkpoint", "t": 1.0, "step": 5, "stall_s": "long"},
        {"kind": 3, "t": 1.0},
        {"kind": "heartbeat"},
    ],
)
def test_a_malformed_message_after_the_hello_is_dropped_and_the_connection_goes_on(
    make_server, caplog, capsys, message
):
    server = make_server()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        identity = {"rank": 0, "node": 0, "attempt": 1, "pid": 100}
        good = {**identity, "kind": "progress", "t": time.time(), "steps": [{"step": 3, "step_time_s": 0.01}]}
        bad = message if isinstance(message, list) else {**identity, **message}
        lines = [{"kind": "hello", "token": server.token, "version": PROTOCOL_VERSION, **identity}, bad, bad, good]
        sock.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
        eventually(
            lambda: 0 in server.snapshot().ranks and server.snapshot().ranks[0].step == 3,
            "the good message after the bad ones is applied",
        )
    assert sum("dropped a message" in r.getMessage() for r in caplog.records) == 1
    assert server.events.empty() and server.metrics.empty() and server.steps.qsize() == 1
    assert "Traceback" not in capsys.readouterr().err


SERVER_PROCESS = textwrap.dedent("""
    import json, resource, sys
    from trainflow.orchestrator.status import StatusServer
    server = StatusServer()
    server.begin_attempt(1, world_size=1)
    print(json.dumps({"port": server.port, "token": server.token}), flush=True)
    for command in sys.stdin:
        if command.strip() == "peak":
            print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, flush=True)  # KiB on Linux
        elif command.strip() == "ranks":
            print(json.dumps({r: s.step for r, s in server.snapshot().ranks.items()}), flush=True)
""")


@pytest.fixture
def server_process() -> Iterator[tuple[subprocess.Popen, dict]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER_PROCESS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield proc, json.loads(proc.stdout.readline())
    finally:
        proc.stdin.close()
        proc.wait(30)


def ask(proc: subprocess.Popen, command: str) -> str:
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def send_endless_line(port: int, first: bytes, total: int) -> int:
    """Send `first`, then `total` bytes without a newline; how many went out before the server cut it off."""
    chunk = b"x" * MiB
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(first)
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
            sock.shutdown(socket.SHUT_WR)
            sock.recv(1)
        except OSError:
            pass
    return sent


@pytest.mark.parametrize("authenticated", [False, True])
def test_a_100_mib_line_does_not_grow_the_servers_memory(server_process, authenticated):
    proc, server = server_process
    hello = json.dumps(
        {
            "kind": "hello",
            "token": server["token"],
            "rank": 0,
            "node": 0,
            "attempt": 1,
            "pid": 1,
            "version": PROTOCOL_VERSION,
        }
    )
    before = int(ask(proc, "peak"))
    sent = send_endless_line(
        server["port"], (hello + "\n").encode() if authenticated else b'{"kind": "hello"', total=100 * MiB
    )
    grown = int(ask(proc, "peak")) - before
    assert sent < 100 * MiB, "the server read the whole line instead of closing the connection"
    assert grown < 16 * MiB, f"the server's peak memory grew by {grown / MiB:.0f} MiB"
    # and it keeps serving workers (the same rank 0 as the hello above, where there was one)
    progress = {
        "kind": "progress",
        "rank": 0,
        "node": 0,
        "attempt": 1,
        "pid": 1,
        "t": time.time(),
        "steps": [{"step": 9}],
    }
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=10) as sock:
        sock.sendall(f"{hello}\n{json.dumps(progress)}\n".encode())
        eventually(lambda: json.loads(ask(proc, "ranks")) == {"0": 9}, "a worker's progress after the long line")
