"""Leave the process groups so that no rank can deadlock or abort on its way out.

Each backward pass puts a Python object (a copy of the contextvars context) in the thread-local
state that every gloo collective launched from it captures, so DDP's gradient all-reduces hold
one. Gloo's barrier keeps references to the work queued before it, and the worker thread that ran
the barrier drops them after the barrier has returned, which frees the last all-reduce and with
it that Python object: the worker needs the GIL for it. Two endings then fail in torch 2.13:

- the script's DDP model outlives `destroy_process_group()`, as in most scripts, and its Reducer
  frees the group when the model goes, with the GIL held, joining that worker: a deadlock;
- the interpreter is already exiting when the worker asks for the GIL: Python ends the thread,
  which cannot unwind through gloo's destructor, and the rank aborts (SIGABRT).

So every gloo group's final barrier is kept until the process ends: its prior work is then freed
by the main thread (which holds the GIL), no worker ever needs the GIL again, and a group freed
later joins idle threads. bench/exit_race.py measures the endings.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed import distributed_c10d

_final_barriers: list[dist.Work] = []  # kept for the rest of the process (see above)


def every_group() -> list[dist.ProcessGroup]:
    """This rank's groups in the order they were made (the same on every rank): the default group,
    DeviceMesh's, the control plane's, the script's own."""
    groups = getattr(getattr(distributed_c10d, "_world", None), "pg_map", None) or {dist.group.WORLD: None}
    return [group for group in groups if group is not None]


def final_barrier(group: dist.ProcessGroup | None = None) -> None:
    """`dist.barrier(group)`, its work kept."""
    work = dist.barrier(group=group, async_op=True)
    work.wait()
    _final_barriers.append(work)


def leave_process_groups() -> None:
    """Collective, every rank: a kept final barrier on each group (the default group whatever its
    backend, the others where they are gloo), then `dist.destroy_process_group()`."""
    default = dist.group.WORLD
    for group in every_group():
        if group is default or dist.get_backend(group) == "gloo":
            final_barrier(group)
    dist.destroy_process_group()
