"""torchrun's c10d rendezvous, without its waits for a small job.

trainflow starts a rendezvous of its own for every attempt (a new run id each time), so every
recovery pays what a round costs. In torch's dynamic rendezvous that is, besides the store calls:
- a 1 s sleep between polls of the store while the round fills, and a random 0-0.3 s before a
  node's first join;
- a 1 s cache of the round's state, so a node sees the others' joins up to 1 s late;
- `inspect.stack()` (which reads every frame's source file) for the name of the calling method,
  twice for each event it records: tens of milliseconds per event.

The agents here poll, and refresh the cached state, every `poll_s` instead: a figure the launcher
scales with the node count (the store then sees about nodes / poll_s reads a second, only while a
round fills), never above torchrun's 1 s. The method name comes from the frame itself."""

from __future__ import annotations

import os
import random
import sys
import time

POLL_ENV = "TRAINFLOW_RDZV_POLL_S"
_LEAST_S = 0.05
_PER_NODE_S = 0.02


def poll_interval_s(nodes: int) -> float:
    return min(1.0, max(_LEAST_S, _PER_NODE_S * nodes))


def install_from_environment() -> None:
    """In an agent: the rendezvous polls at the interval the launcher set, if it set one."""
    value = os.environ.get(POLL_ENV)
    if value:
        install(min(1.0, max(0.01, float(value))))


def install(poll_s: float) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rendezvous

    def delay(seconds: float | tuple[float, float]) -> None:
        if isinstance(seconds, tuple):  # the first join's spread: kept, but within one poll
            seconds = random.uniform(0, min(seconds[1], poll_s))
        else:
            seconds = min(seconds, poll_s)
        if seconds >= 0.01:
            time.sleep(seconds)

    def method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:
            return "no_method_name"

    holder = rendezvous._BackendRendezvousStateHolder
    cached_init = holder.__init__

    def init_with_short_cache(self, backend, settings, cache_duration=1) -> None:
        cached_init(self, backend, settings, cache_duration=min(cache_duration, poll_s))

    rendezvous._delay = delay
    rendezvous.get_method_name = method_name
    holder.__init__ = init_with_short_cache
