"""The drills' storage relay: an outage refuses connections, a stalled one holds every request
unanswered until it is over and then answers it, as an endpoint that stops answering would."""

from __future__ import annotations

import socket
import threading

import pytest

from trainflow.drills.storage_proxy import StorageProxy


@pytest.fixture
def echo_proxy():
    """A one-line echo server on loopback behind a StorageProxy; both closed afterwards."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    proxy = StorageProxy("127.0.0.1", server.getsockname()[1])
    yield proxy
    proxy.close()
    server.close()


def ask(port: int, payload: bytes, answered: list[bytes]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(payload)
        answered.append(sock.recv(1024))


def test_a_stalled_endpoint_answers_nothing_until_the_outage_ends(echo_proxy):
    answered: list[bytes] = []
    ask(echo_proxy.port, b"before", answered)
    assert answered == [b"before"]

    echo_proxy.outage(600, stall=True)
    asker = threading.Thread(target=ask, args=(echo_proxy.port, b"during", answered), daemon=True)
    asker.start()
    asker.join(1.0)
    assert asker.is_alive() and answered == [b"before"]  # held, neither answered nor refused
    echo_proxy.end_outage()
    asker.join(60)
    assert answered == [b"before", b"during"]


def test_an_outage_without_stall_refuses_connections(echo_proxy):
    echo_proxy.outage(600)
    answered: list[bytes] = []
    try:
        ask(echo_proxy.port, b"during", answered)
    except OSError:  # reset before the request was read
        answered.append(b"")
    assert answered == [b""]  # accepted and closed, or reset: never an answer
