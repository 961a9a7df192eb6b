"""Break a rank's process groups off, so that every peer waiting on it in a collective fails now.

A rank recovering in place stays alive, and torch gives gloo no abort: neither
`destroy_process_group()` nor a backend's `abort()`/`shutdown()` closes gloo's connections while
anything still holds the group (a DDP model does), and a peer inside a collective with this rank
would wait out the whole collective timeout. So the sockets every process group makes are noted as
it is made (c10d's one helper that makes them all: the default group, new_group, DeviceMesh's) and
shut down here: each peer then reads the end of its stream and its collective raises. NCCL groups
have their communicators aborted instead.
"""

from __future__ import annotations

import os
import socket

import torch.distributed as dist
from torch.distributed import distributed_c10d

_group_sockets: set[str] = set()  # "socket:[inode]" of every socket a process group made
_installed = False


def note_group_sockets() -> None:
    """From now on, remember the sockets each new process group makes (once per process)."""
    global _installed
    if _installed:
        return
    make = distributed_c10d._new_process_group_helper

    def noted(*args, **kwargs):
        before = _sockets()
        try:
            return make(*args, **kwargs)
        finally:
            _group_sockets.update(set(_sockets()) - set(before))

    distributed_c10d._new_process_group_helper = noted
    _installed = True


def break_off_groups() -> int:
    """Abort NCCL communicators, shut down every socket a group made (their peers' collectives fail
    at once), then destroy the groups. Returns the sockets shut down."""
    for group in _every_group():
        try:
            if dist.get_backend(group) == "nccl":
                distributed_c10d._abort_process_group(group)
        except (RuntimeError, ValueError, AttributeError):
            pass
    shut = 0
    for name, fd in _sockets().items():
        if name not in _group_sockets:
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            # a listener is left as it is: gloo's loop would fail to accept on it, and abort
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.shutdown(socket.SHUT_RDWR)  # the connection itself, whoever else holds its descriptor
                shut += 1
        except OSError:
            pass  # one already closed
        finally:
            sock.close()
    _group_sockets.clear()  # the next groups' sockets are new ones
    try:
        dist.destroy_process_group()
    except (RuntimeError, ValueError, AssertionError):
        pass
    return shut


def _every_group() -> list:
    groups = getattr(getattr(distributed_c10d, "_world", None), "pg_map", None) or {}
    return [group for group in groups if group is not None]


def _sockets() -> dict[str, int]:
    """This process's sockets: "socket:[inode]" -> a descriptor of it."""
    found = {}
    for entry in os.scandir("/proc/self/fd"):
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue
        if target.startswith("socket:"):
            found.setdefault(target, int(entry.name))
    return found
