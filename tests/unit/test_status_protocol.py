"""The status channel's protocol: every message survives the wire as it was, anything else is
refused by name, and a peer of another protocol version is refused with a line saying why."""

from __future__ import annotations

import json
import socket
import time
import typing

import pytest

from trainflow.contracts import status_protocol as wire
from trainflow.orchestrator.status import StatusServer

EXAMPLES = [
    wire.Hello(token="t" * 32, rank=3, node=1, attempt=2, pid=4242, version=wire.PROTOCOL_VERSION, t=1.5),
    wire.Hello(token="t" * 32, rank=3, node=1, attempt=2, pid=4243, version=wire.PROTOCOL_VERSION, replaces=[4242]),
    wire.Replaced(pids=[4242], t=1.6),
    wire.Heartbeat(t=2.0),
    wire.Progress(
        steps=[
            wire.StepEntry(step=7, t=3.0, step_time_s=0.1, compute_s=0.08, metrics={"loss": 0.5, "lr": None}),
            wire.StepEntry(step=8, loss=0.25),
        ],
        t=3.1,
    ),
    wire.Started(world_size=16, process_started_at=1.0, imported_at=2.0, rendezvous_at=3.0, t=3.5),
    wire.Restored(
        step=30,
        prefix="run/step-00000030",
        tier="durable",
        bytes=1024,
        seconds=0.5,
        fallbacks=["local step 40: bad hash"],
        t=4.0,
    ),
    wire.Checkpoint(
        step=40,
        prefix="run/step-00000040",
        status="committed",
        bytes=2048,
        files=3,
        world_size=2,
        stall_s=0.1,
        stage_s=0.01,
        save_s=0.02,
        hash_s=0.003,
        upload_s=0.2,
        commit_s=0.05,
        t=5.0,
    ),
    wire.Checkpoint(step=41, prefix="run/step-00000041", status="failed", reason="the bucket is gone", t=5.5),
    wire.Storage(state="waiting", since=6.0, call="upload of shard 0", t=6.0),
    wire.Layout(
        strategy="fsdp",
        world_size=8,
        dp_degree=4,
        tp_degree=2,
        pp_degree=1,
        mesh={"dp": 4, "tp": 2},
        replicated=["dp"],
        warnings=["tp degree 2 but no tensor parallel module"],
        t=7.0,
    ),
    wire.Error(type="ValueError", message="bad input", traceback="Traceback...", step=9, t=8.0),
    wire.RestartedInPlace(
        round=1,
        outcome="INFRA",
        reason="rank 1 raised DistNetworkError at step 12: link down",
        cause_rank=1,
        failed_step=12,
        restored_step=11,
        failed_at=8.1,
        abort_s=0.003,
        rejoin_s=0.13,
        restore_s=0.002,
        t=8.3,
    ),
    wire.RestartedInPlace(
        round=2,
        outcome="CRASHED",
        reason="rank 1 was killed by SIGSEGV (process 4242) in step 20",
        cause_rank=1,
        failed_step=20,
        restored_step=19,
        failed_at=9.1,
        abort_s=0.0,
        rejoin_s=0.4,
        restore_s=0.002,
        replaced=True,
        t=9.3,
    ),
    wire.Preempted(step=12, signalled=True, requested_at=9.0, t=9.5),
    wire.Diverged(step=20, hashes=["0a", "0b"], groups=[[0, 1]], t=10.0),
    wire.Finished(step=100, loss=0.125, params_sha256="ab" * 32, t=11.0),
    wire.Resources(figures={"cpu_percent": 93.5, "gpu_0_memory_mb": None}, t=12.0),
    wire.NodeHello(token="t" * 32, node=5, attempt=1, version=wire.PROTOCOL_VERSION, t=13.0),
    wire.NodeReport(
        marks=[
            wire.RankMark(
                rank=40,
                pid=7,
                seen_age_s=0.2,
                step=9,
                progressed_age_s=0.1,
                step_time_s=0.5,
                compute_n=2,
                compute_sum_s=0.8,
            )
        ],
        sums=[wire.StepSum(step=9, t=14.0, ranks=8, loss_sum=4.0, loss_count=8, metrics={"loss": 0.5})],
        closed=[41],
        t=14.5,
    ),
    wire.RankEvent(rank=40, pid=7, message=wire.Error(type="OSError", message="disk full", t=15.0), t=15.1),
    wire.Answer(t=16.0),
    wire.Refused(reason="status protocol version 1", t=17.0),
]


def test_every_kind_has_an_example():
    assert {type(m).kind for m in EXAMPLES} == set(wire.KINDS)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).kind)
def test_every_message_survives_the_wire(message):
    line = wire.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert wire.decode(line) == message


@pytest.mark.parametrize(
    "line, why",
    [
        (b'{"kind": "warp", "t": 1}', "unknown kind 'warp'"),
        (b'{"t": 1}', "no kind"),
        (b"[1]", "not an object"),
        (b'{"kind": "finished", "step": 7.5, "t": 1}', "finished.step is not int"),
        (b'{"kind": "finished", "t": 1}', "finished: no step"),
        (b'{"kind": "finished", "step": 7, "t": 1, "color": "red"}', "unknown field 'color'"),
        (b'{"kind": "heartbeat"}', "no time (t)"),
        (b'{"kind": "progress", "t": 1, "steps": [{"step": 1, "metrics": {"loss": "low"}}]}', "progress.steps"),
        (
            b'{"kind": "rank-event", "rank": 1, "pid": 2, "t": 1, "message": {"kind": "heartbeat", "t": 1}}',
            "'heartbeat' message is not allowed here",
        ),
        (b'{"kind": "preempted", "step": 1, "signalled": 1, "t": 1}', "signalled is not bool"),
    ],
)
def test_anything_else_is_refused_by_name(line, why):
    with pytest.raises(wire.Malformed, match=why.replace("(", r"\(").replace(")", r"\)")):
        wire.decode(line)


def test_every_field_has_a_type_the_decoder_checks():
    for cls in wire.KINDS.values():
        for name, hint in typing.get_type_hints(cls).items():
            if typing.get_origin(hint) is not typing.ClassVar:
                assert hint is not typing.Any, f"{cls.__name__}.{name}"


def read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_a_worker_of_another_protocol_version_is_refused_clearly(caplog):
    server = StatusServer()
    server.begin_attempt(1, world_size=1)
    try:
        hello = {
            "kind": "hello",
            "token": server.token,
            "rank": 0,
            "node": 0,
            "attempt": 1,
            "pid": 1,
            "version": wire.PROTOCOL_VERSION + 1,
        }
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(json.dumps(hello).encode() + b"\n")
            refused = wire.decode(read_line(sock))
            assert isinstance(refused, wire.Refused) and f"version {wire.PROTOCOL_VERSION + 1}" in refused.reason
            assert sock.recv(1) == b""  # and closed
        assert server.snapshot().ranks == {}
        lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
        assert len(lines) == 1 and f"speaks version {wire.PROTOCOL_VERSION}" in lines[0]
    finally:
        server.close()


def test_an_unknown_message_after_the_hello_is_dropped_with_one_log_line(caplog):
    server = StatusServer()
    server.begin_attempt(1, world_size=1)
    try:
        hello = wire.Hello(token=server.token, rank=0, node=0, attempt=1, pid=1, version=wire.PROTOCOL_VERSION)
        good = wire.Progress(steps=[wire.StepEntry(step=4)])
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(wire.encode(hello) + b'{"kind": "telemetry", "t": 1}\n' * 3 + wire.encode(good))
            deadline = time.monotonic() + 10
            while not (0 in server.snapshot().ranks and server.snapshot().ranks[0].step == 4):
                assert time.monotonic() < deadline, "the message after the unknown ones is applied"
                time.sleep(0.02)
            assert isinstance(wire.decode(read_line(sock)), wire.Answer)  # the stream is answered
        dropped = [r.getMessage() for r in caplog.records if "dropped a message" in r.getMessage()]
        assert len(dropped) == 1 and "unknown kind 'telemetry'" in dropped[0]
    finally:
        server.close()
