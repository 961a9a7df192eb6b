"""Training state as DCP-safe tensors plus a small JSON document.

DCP unpickles any non-tensor value it loads, so only tensors go through DCP; everything else
(optimizer hyper-parameters, RNG states, data position, step) is JSON, which loads safely.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch

TENSOR_REF = "__tensor__"


def split_tensors(tree: Any, prefix: str = "") -> tuple[dict[str, torch.Tensor], Any]:
    """Replace every tensor leaf by a reference; returns (tensors by dotted key, JSON-able tree)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[path] = node
            return {TENSOR_REF: path}
        if isinstance(node, dict):
            return {str(k): walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [walk(v, f"{path}.{i}") for i, v in enumerate(node)]
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        raise TypeError(f"{path}: {type(node).__name__} cannot be checkpointed (use tensors or JSON values)")

    return tensors, walk(tree, prefix)


def join_tensors(plain: Any, tensors: dict[str, torch.Tensor], int_keys: bool = False) -> Any:
    """Inverse of split_tensors; dict keys that look like integers come back as ints if asked."""
    if isinstance(plain, dict):
        if set(plain) == {TENSOR_REF}:
            return tensors[plain[TENSOR_REF]]
        return {
            (int(k) if int_keys and k.lstrip("-").isdigit() else k): join_tensors(v, tensors, int_keys)
            for k, v in plain.items()
        }
    if isinstance(plain, list):
        return [join_tensors(v, tensors, int_keys) for v in plain]
    return plain


def capture_rng() -> dict:
    np_state = np.random.get_state()
    return {
        "python": _to_lists(random.getstate()),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
        "cuda": [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def params_sha256(named_tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over parameters in sorted-name order: equal hashes mean bit-identical models.
    The tensors must be whole (see full_params_sha256 for a sharded model)."""
    digest = hashlib.sha256()
    for name in sorted(named_tensors):
        tensor = _plain(named_tensors[name]).detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def full_params_sha256(model: torch.nn.Module) -> str | None:
    """The one definition of a model's hash, whatever its layout: params_sha256 over the full model
    state (every DTensor gathered whole) under its wrapper-free names (no DDP `module.`, no FSDP or
    compile prefixes), so DDP, FSDP2, TP and HSDP runs of one model, or a run resharded to fewer
    ranks, compare. Collective: every rank calls it; rank 0 gets the hash, the others None."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # gathered into rank 0's host memory only: the others get an empty dict
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return params_sha256(full) if full else None


def local_params_hash(model: torch.nn.Module) -> int:
    """A cheap 60-bit hash of the values this rank holds (its shards of a sharded parameter), for
    comparing replicas: no collective, nothing gathered."""
    named = {name: local_part(p.detach()) for name, p in model.named_parameters()}
    return int(params_sha256(named)[:15], 16)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's own values of a tensor: a DTensor's local shard, any other tensor itself."""
    to_local = getattr(tensor, "to_local", None)  # a DTensor: this rank's shard
    return to_local() if callable(to_local) else tensor


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    if callable(getattr(tensor, "to_local", None)):
        raise TypeError("params_sha256 needs whole tensors: use full_params_sha256(model) for a sharded model")
    return tensor


def _to_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_to_lists(v) for v in value]
    return value
