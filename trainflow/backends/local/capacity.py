"""What this machine can host with the local backend, checked before anything is created.

Every local node shares this machine, so a node's CPU share cannot exceed the machine, and the
ranks of all nodes together get at most RANKS_PER_CORE per core: beyond that, gloo ranks starve
each other (and the orchestrator) so badly that heartbeats and steps stall for no real reason.
For a small model that limit is the user's to lift (`resources.oversubscribe: true`): a 64-rank
job of a tiny model trains, fails and resumes exactly on two cores, only slowly.
"""

from __future__ import annotations

import os

from trainflow.runspec import Resources

RANKS_PER_CORE = 4
CPU_OVERSUBSCRIPTION = 4  # the nodes' CPU shares together, against the machine's cores


def local_capacity_problem(resources: Resources, cores: int | None = None, oversubscribe: bool = False) -> str | None:
    """Why the local backend cannot host `resources` here (naming the field), or None. With
    `oversubscribe` (resources.oversubscribe) the ranks per core are not limited."""
    cores = cores or os.cpu_count() or 1
    if resources.cpu > cores:
        return f"resources.cpu: {resources.cpu:g} cores per node, but this machine has {cores}"
    if resources.cpu * resources.nodes > CPU_OVERSUBSCRIPTION * cores:
        return (
            f"resources.cpu: {resources.cpu:g} x {resources.nodes} nodes oversubscribes this machine's "
            f"{cores} cores more than {CPU_OVERSUBSCRIPTION}-fold"
        )
    ranks = resources.nodes * resources.procs_per_node
    if ranks > RANKS_PER_CORE * cores and not oversubscribe:
        return (
            f"resources.procs_per_node: {resources.nodes} nodes x {resources.procs_per_node} = {ranks} ranks; "
            f"this machine's {cores} cores host at most {RANKS_PER_CORE * cores} ({RANKS_PER_CORE} per core); "
            "resources.oversubscribe: true allows more for a small model"
        )
    if resources.gpu:
        visible = _visible_gpus()
        if resources.gpu * resources.nodes > visible:
            return (
                f"resources.gpu: {resources.gpu} x {resources.nodes} nodes = {resources.gpu * resources.nodes} "
                f"GPU(s) requested, {visible} visible on this machine"
            )
    return None


def _visible_gpus() -> int:
    import torch  # only when GPUs are asked for: torch takes seconds to import

    return torch.cuda.device_count()
