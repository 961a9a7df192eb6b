"""A spare rank process, kept by a zygote for a job that replaces dead ranks in place
(backends/rank_replacement.py): forked ahead, it imports what a rank's first DDP construction
imports (torch._dynamo: most of a replacement rank's time to rejoin), then waits for the command of
the rank it is to become. It imports that itself: ranks forked from a process that had imported it
deadlock at exit far more often (preload.py), so the zygote never does."""

from __future__ import annotations

import importlib
import os
import signal
import socket

from trainflow.backends.warm.child import CHILD_SIGNALS, Command
from trainflow.backends.warm.protocol import WORKER, ChannelClosed, NotForkable, receive_message
from trainflow.worker_config import MEMORY_COPIES_ENV

SPARE = "spare"  # its role among a zygote's children until it is handed a command
SPARE_MODULES = ("torch._dynamo",)


def wants_a_spare(command: Command) -> bool:
    """A rank of a job whose dead ranks are replaced in place (its node keeps in-memory copies)."""
    return command.role == WORKER and bool(command.env.get(MEMORY_COPIES_ENV))


def wait_as_spare(channel: socket.socket) -> tuple[Command, list[int]] | None:
    """In the spare, which leads a session of its own: the imports, then the command it becomes
    and its stdio; None once the zygote closed the channel (it is ending, or has no use for it).
    Returns with the zygote's signals blocked, as `child.become` expects them."""
    signal.set_wakeup_fd(-1)  # the zygote's wake-up pipe, closed in this process
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)  # until it is a rank, a stop ends it at once
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CHILD_SIGNALS)
    for name in SPARE_MODULES:
        try:
            importlib.import_module(name)
        except Exception:
            pass  # the rank imports it, as it would started cold, and reports its failure itself
    try:
        message, fds = receive_message(channel)
    except (ChannelClosed, OSError):
        return None
    finally:
        channel.close()
    signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_SIGNALS)
    try:
        return Command.parse(message), fds
    except (NotForkable, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
        return None
