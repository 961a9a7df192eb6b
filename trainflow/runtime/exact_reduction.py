"""Gradient averaging whose bits do not depend on DDP's bucket layout, so a resumed run is exact.

DDP copies each bucket's gradients into one flat buffer and all-reduces the buffer. A new DDP
starts with every parameter in one bucket, in parameter order; after its first backward it
rebuilds the buckets in the order the gradients became ready, and keeps that layout. With three
ranks or more, gloo's all-reduce adds an element's values in an order set by where the element
lies in the buffer, and floating-point addition is not associative. So the first step after a
restart (a new DDP, first layout) adds gradients in another order than the same step of an
uninterrupted run (rebuilt layout), and the runs part by one rounding. With two ranks every
element is a single addition, which commutes: exact whatever the layout.

Reducing each parameter's gradient as a tensor of its own makes the order a function of that
parameter alone, the same in every iteration of every run. It costs one collective per parameter
instead of one per bucket, so it is used only where the order can matter.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations as real types
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def reduce_each_parameter(model: torch.nn.Module) -> bool:
    """Make a DDP model average every gradient on its own. Call it before the first step of every
    run, fresh or restored, so both reduce alike. False when the model is not DDP, its group has
    two ranks or fewer, or the script registered a comm hook of its own (DDP allows one)."""
    if not isinstance(model, DistributedDataParallel):
        return False
    group = model.process_group
    if dist.get_world_size(group) <= 2:
        return False
    try:
        model.register_comm_hook(group, _average_each_gradient)
    except RuntimeError:  # "register_comm_hook ... can only be called once"
        if dist.get_rank() == 0:
            print("trainflow: warning: the model has a comm hook of its own; a resumed run may differ from an "
                  "uninterrupted one in the last bits", file=sys.stderr, flush=True)
        return False
    return True


def _average_each_gradient(group: dist.ProcessGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    size = dist.get_world_size(group)
    # the gradients are views into the bucket's buffer: reducing them in place reduces the buffer
    works = [dist.all_reduce(gradient.div_(size), group=group, async_op=True) for gradient in bucket.gradients()]
    buffer = bucket.buffer()
    return torch.futures.collect_all([work.get_future() for work in works]).then(lambda _: buffer)
