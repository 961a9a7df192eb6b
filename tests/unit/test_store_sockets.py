"""Where torchrun's stores listen: the address the nodes use, or (where that cannot be told) c10d's
own choice; never a wildcard chosen here."""

from __future__ import annotations

import errno
import socket

import pytest

from trainflow.backends.store_sockets import bind_address, listening_socket, store_socket


def test_an_address_is_listened_on_as_given_and_localhost_on_loopback():
    assert bind_address("127.0.0.1") == "127.0.0.1"
    assert bind_address("localhost") in ("127.0.0.1", "::1")
    with store_socket("127.0.0.1", 0) as sock:
        assert sock.getsockname()[0] == "127.0.0.1"


def test_an_address_this_host_does_not_have_or_a_name_that_does_not_resolve_is_left_to_c10d():
    assert store_socket("192.0.2.1", 0) is None  # TEST-NET-1: never an address of this host
    assert bind_address("no-such-host.invalid") is None


def test_a_port_taken_on_the_nodes_address_is_an_error_of_its_own():
    with listening_socket("127.0.0.1") as taken:
        with pytest.raises(OSError) as raised:
            store_socket("127.0.0.1", taken.getsockname()[1])
    assert raised.value.errno == errno.EADDRINUSE


def test_the_socket_is_listening_before_anyone_is_told_its_port():
    with listening_socket("127.0.0.1") as sock:
        with socket.create_connection(sock.getsockname(), timeout=5):
            pass  # the kernel accepts into the backlog: nothing else can bind the port
