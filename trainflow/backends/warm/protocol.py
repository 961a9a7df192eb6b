"""Messages between a zygote and its clients: one JSON object per message, length-prefixed, with
file descriptors (a child's stdio) carried alongside as SCM_RIGHTS."""

from __future__ import annotations

import json
import os
import socket
import struct

AGENT = "agent"  # a forked process's role: torchrun's agent for a node
WORKER = "worker"  # or a rank's command
_HEADER = struct.Struct("!I")
_MAX_FDS = 8
_MAX_MESSAGE = 16 << 20


class ChannelClosed(ConnectionError):
    """The other end has gone."""


class NotForkable(ValueError):
    """A command a zygote cannot run as a fork: it must be started the usual way."""


def send_message(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    body = json.dumps(message).encode()
    data = _HEADER.pack(len(body)) + body
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def receive_message(sock: socket.socket) -> tuple[dict, list[int]]:
    """One whole message and the descriptors that came with it; ChannelClosed at the end."""
    head, fds = _receive_exactly(sock, _HEADER.size, with_fds=True)
    (length,) = _HEADER.unpack(head)
    if length > _MAX_MESSAGE:
        raise ChannelClosed(f"message of {length} bytes")
    body, _ = _receive_exactly(sock, length, with_fds=False)
    return json.loads(body), fds


def _receive_exactly(sock: socket.socket, size: int, with_fds: bool) -> tuple[bytes, list[int]]:
    chunks, fds, got = [], [], 0
    while got < size:
        if with_fds and not got:
            data, new_fds, _flags, _addr = socket.recv_fds(sock, size, _MAX_FDS)
            fds.extend(new_fds)
        else:
            data = sock.recv(size - got)
        if not data:
            for fd in fds:
                os.close(fd)
            raise ChannelClosed("the other end closed the channel")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks), fds
