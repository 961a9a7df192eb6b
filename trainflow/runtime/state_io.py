"""The training state in and out of a checkpoint folder: what a save captures, and how a verified
checkpoint is read back into the live model, optimizer and extras.

Only JSON and DCP's tensors are read, and only from files the manifest lists: nothing is unpickled.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainflow.checkpoint.dcp_io import SafeFileSystemReader
from trainflow.checkpoint.manifest import Manifest
from trainflow.runtime.checkpoint_context import CheckpointContext
from trainflow.runtime.restore_checks import metadata_problems, read_personal, read_shared, tensor_refs
from trainflow.runtime.state import capture_rng, join_tensors, restore_rng, split_tensors

SHARED_STATE = "state.json"


class Rejected(Exception):
    """One restore candidate failed; every rank raises it at the same point (decided on gathered data)."""


@dataclass(frozen=True)
class Stateful:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    extras: dict[str, Any]


def rank_file(rank: int) -> str:
    return f"rank-{rank}.json"


def state_dicts(state: Stateful) -> tuple[dict, dict]:
    optimizers = [state.optimizer] if state.optimizer is not None else []
    return get_state_dict(state.model, optimizers)


def capture(step: int, state: Stateful) -> tuple[dict[str, torch.Tensor], str, str]:
    """The tensors to stage, the shared non-tensor state and this rank's own state (RNG, extras)."""
    model_sd, optim_sd = state_dicts(state)
    tensors, shared = split_tensors({"model": model_sd, "optim": optim_sd})
    personal = {
        "step": step,
        "rng": capture_rng(),
        "extras": {name: obj.state_dict() for name, obj in state.extras.items()},
    }
    # serialised now: the live objects change as soon as training goes on
    return tensors, json.dumps(shared), json.dumps(personal)


def reject_if_any(ctx: CheckpointContext, problems: list[str]) -> None:
    """Collective: every rank rejects the candidate when any rank found a problem."""
    seen = list(dict.fromkeys(p for g in ctx.all_gather(problems) for p in g))
    if seen:
        raise Rejected("; ".join(seen))


def load(ctx: CheckpointContext, folder: Path, manifest: Manifest, state: Stateful, prefix: str) -> float:
    """Collective: read a verified checkpoint into the live objects; returns the seconds it took. A
    checkpoint whose own files are malformed is rejected on every rank alike (the problems are
    gathered first)."""
    began = time.perf_counter()
    model_sd, optim_sd = state_dicts(state)
    template, _ = split_tensors({"model": model_sd, "optim": optim_sd})
    own = folder / rank_file(ctx.rank)
    listed = {e.name for e in manifest.files}
    shared, problems = read_shared(folder / SHARED_STATE)
    personal, more = read_personal(own if own.name in listed else folder / rank_file(0), manifest.step)
    problems += more + metadata_problems(folder, listed)
    reject_if_any(ctx, problems)
    refs = tensor_refs(shared)
    unknown = [key for key in refs if key not in template]
    if unknown:
        raise ValueError(
            f"checkpoint {prefix} holds state this model and optimizer do not have ({', '.join(unknown[:5])}): "
            "was the model changed since it was saved?"
        )
    wanted = {key: template[key] for key in refs}
    try:
        dcp.load(wanted, storage_reader=SafeFileSystemReader(folder, listed), process_group=ctx.group)
    except CheckpointException as exc:  # raised on every rank alike; the next candidate rewrites every tensor
        raise Rejected(f"DCP could not read it: {str(exc).splitlines()[-1][:500]}") from None
    restored = join_tensors(shared, wanted)
    if state.optimizer is not None:
        set_state_dict(
            state.model,
            state.optimizer,
            model_state_dict=restored["model"],
            optim_state_dict=restored["optim"],
        )
    else:
        set_state_dict(state.model, [], model_state_dict=restored["model"], optim_state_dict={})
    problems = []
    if own.name in listed:
        try:
            restore_rng(personal["rng"])
        except (TypeError, ValueError, RuntimeError, IndexError, OverflowError) as exc:
            problems.append(f"{own.name}: RNG state not restorable ({type(exc).__name__}: {str(exc)[:200]})")
    reject_if_any(ctx, problems)
    for name, obj in state.extras.items():
        if name in personal["extras"]:
            obj.load_state_dict(personal["extras"][name])
    return time.perf_counter() - began
