"""What the registered model actually does with the mesh: which dimensions hold replicas (the
only ranks whose values must be equal) and where it contradicts the spec's declared layout.

Read from the parameters themselves: a DTensor parameter says, per mesh dimension, whether it is
sharded or replicated there; a plain tensor (DDP, or a module left whole) is replicated along
every dimension. A mesh dimension a parameter's mesh does not have is one it is replicated along.
"""

from __future__ import annotations

import torch

from trainflow.runtime.layout import ParallelLayout

DATA_DIMS = ("dp", "dp_shard")  # where fsdp and hybrid shard parameters


def _placements(model: torch.nn.Module, layout: ParallelLayout) -> list[dict[str, bool]] | None:
    """Per DTensor parameter: mesh dimension name -> sharded there. None when a parameter lives
    on a mesh whose dimensions are not the layout's (a mesh the script built itself)."""
    found = []
    for parameter in model.parameters():
        mesh = getattr(parameter, "device_mesh", None)
        if mesh is None:
            continue
        names = mesh.mesh_dim_names or ()
        if not names or any(name not in layout.dim_names for name in names):
            return None
        found.append({name: placement.is_shard() for name, placement in zip(names, parameter.placements)})
    return found


def replicated_dims(model: torch.nn.Module, layout: ParallelLayout) -> tuple[str, ...] | None:
    """Mesh dimensions along which every parameter is replicated; None if that cannot be told."""
    placements = _placements(model, layout)
    if placements is None:
        return None
    return tuple(name for name in layout.dim_names if not any(p.get(name, False) for p in placements))


def layout_warnings(model: torch.nn.Module, layout: ParallelLayout) -> list[str]:
    """Where the registered model contradicts the spec, each naming the spec field."""
    placements = _placements(model, layout)
    if placements is None:
        return []
    sharded = {name for p in placements for name, is_shard in p.items() if is_shard}
    warnings = []
    data_sharded = sharded & set(DATA_DIMS)
    if layout.strategy in ("fsdp", "hybrid") and layout.data > 1 and not data_sharded:
        dim = "dp_shard" if layout.strategy == "hybrid" else "dp"
        warnings.append(
            f"parallel.strategy: {layout.strategy}, but no parameter of the registered model is sharded over "
            f"{dim!r} (call fully_shard(model, mesh=run.mesh[...]) or declare strategy: ddp)"
        )
    if layout.strategy == "ddp" and data_sharded:
        warnings.append(
            "parallel.strategy: ddp, but the registered model's parameters are sharded over the data-parallel "
            "dimension (declare strategy: fsdp, or hybrid for HSDP)"
        )
    if layout.tensor > 1 and "tp" not in sharded:
        warnings.append(
            f"parallel.tensor: {layout.tensor}, but no parameter of the registered model is sharded over 'tp' "
            "(parallelize_module(model, run.mesh['tp'], plan), or declare tensor: 1)"
        )
    return warnings
