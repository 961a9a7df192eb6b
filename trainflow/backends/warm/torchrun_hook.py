"""In an agent forked by a zygote: torchrun's rank starts become fork requests to the node's zygote.

torchrun starts each rank through `get_subprocess_handler` (torch.distributed.elastic.multiprocessing);
the handler here asks the zygote for the process instead of calling Popen and otherwise is torchrun's
own: its log files, its session per rank, its signals. A command the zygote cannot fork (another
interpreter, NUMA binding) or a zygote that has gone gets torchrun's usual Popen."""

from __future__ import annotations

import logging
import os
import socket

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from trainflow.backends.warm.client import ZygoteChannel
from trainflow.backends.warm.protocol import WORKER, NotForkable

log = logging.getLogger("trainflow.warm")
_channel: ZygoteChannel | None = None


class ForkingSubprocessHandler(SubprocessHandler):
    def _popen(self, args: tuple, env: dict[str, str]):
        stdio = [0, _fd(self._stdout, 1), _fd(self._stderr, 2)]
        try:
            return _channel.fork(WORKER, [str(a) for a in args], env, os.getcwd(), stdio)
        except NotForkable as exc:
            log.warning("rank %s starts cold: %s", self.local_rank_id, exc)
            return super()._popen(args, env)

    def close(self, death_sig=None) -> None:
        """torchrun's close, for a rank the zygote may have reaped since torchrun last polled it:
        its process group is gone, and the signal finds no one (torchrun's own close would raise,
        and end the agent before its failure report)."""
        try:
            super().close(death_sig)
        except ProcessLookupError:
            for stream in (self._stdout, self._stderr):
                if stream is not None:
                    stream.close()


def _fd(stream, default: int) -> int:
    return stream.fileno() if stream is not None else default


def _handler(entrypoint, args, env, stdout, stderr, local_rank_id, numa_options=None):
    return ForkingSubprocessHandler(
        entrypoint=entrypoint,
        args=args,
        env=env,
        stdout=stdout,
        stderr=stderr,
        local_rank_id=local_rank_id,
        numa_options=numa_options,
    )


def install(channel_fd: int) -> None:
    global _channel
    _channel = ZygoteChannel(socket.socket(fileno=channel_fd))
    api.get_subprocess_handler = _handler
