"""One DDP bucket layout from the first step of every run, so a resumed run is bit-identical.

DDP copies each bucket's gradients into one flat buffer and all-reduces the buffer. A new DDP
reduces its first iteration with every parameter in one bucket, in parameter order; after that
first backward it rebuilds the buckets in the order the gradients became ready, and keeps them.
With three ranks or more, gloo's all-reduce adds an element's values in an order set by where
the element lies in the buffer, and floating-point addition is not associative. So the first step
after a restart (a new DDP, first layout) added the gradients in another order than the same step
of an uninterrupted run (rebuilt layout), and the runs parted by one rounding. (With two ranks
every element is a single addition, which commutes: exact whatever the layout.)

Handing the reducer every parameter, in parameter order, as its "rebuilt" order before the first
forward makes it build its final buckets (same size caps) at that forward and never again: every
iteration of every run, fresh or restored, reduces with the same layout. The reducer's own call
for this (`_push_all_rebuilt_params`, what DDP's Join uses) is private; tests/unit/test_ddp_buckets.py
fails if a torch upgrade changes it. A Python comm hook reducing each gradient on its own would be
exact too, but costs a small model on loaded CPUs several times its step time.
"""

from __future__ import annotations

import sys

import torch
from torch.nn.parallel import DistributedDataParallel


def fix_bucket_layout(model: torch.nn.Module) -> bool:
    """Make a DDP model keep one bucket layout from its first forward on. Every rank calls it, before
    the first forward of the run. False when the model is not DDP or the reducer cannot be told."""
    if not isinstance(model, DistributedDataParallel):
        return False
    push = getattr(getattr(model, "reducer", None), "_push_all_rebuilt_params", None)
    if push is None:
        print("trainflow: warning: this torch's DDP cannot be given a fixed bucket layout; with more than "
              "two ranks a resumed run may differ from an uninterrupted one in the last bits",
              file=sys.stderr, flush=True)
        return False
    push()  # no-op if the reducer has already recorded an order (a backward before restore)
    return True
