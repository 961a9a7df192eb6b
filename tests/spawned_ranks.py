"""Run a function as real ranks in new processes, with a deadline: a rank that deadlocks fails its
test with the stacks of the ranks still running, and is killed, instead of holding pytest (and
multiprocessing's exit, which waits for its children) forever."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch.multiprocessing as mp

from trainflow.backends.stacks import py_spy_dump

DEADLINE_S = 150.0


def run_ranks(
    fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, deadline_s: float = DEADLINE_S
) -> dict[Any, Any]:
    """`fn(rank, *args, results)` in `nprocs` spawned processes; once all exited cleanly, what they
    put in `results` (a shared dict)."""
    with mp.Manager() as manager:
        results = manager.dict()
        ranks = mp.start_processes(fn, args=(*args, results), nprocs=nprocs, join=False, start_method="spawn")
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if ranks.join(timeout=1.0):  # raises if a rank failed
                return dict(results)
        stuck = [p for p in ranks.processes if p.is_alive()]
        stacks = "\n".join(py_spy_dump(p.pid) for p in stuck)
        for process in stuck:
            process.kill()
            process.join()
    pytest.fail(f"{len(stuck)} of {nprocs} ranks still running after {deadline_s:.0f} s:\n{stacks}")


def free_port() -> int:
    """A loopback port nobody listens on now, for the ranks' rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
