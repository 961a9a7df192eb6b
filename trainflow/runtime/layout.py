"""The spec's parallel layout as the script sees it: strategy, degrees, and the named device mesh.

Mesh dimensions, outermost first (a dimension of size 1 is still there, so a script can always
ask for `run.mesh["dp"]` or `run.mesh["tp"]`):

    ddp, fsdp:  ("dp", "tp")                        data parallel × tensor parallel
    hybrid:     ("dp_replicate", "dp_shard", "tp")  replicated across nodes, sharded within a node
    with parallel.pipeline > 1, a leading "pp"

Ranks are laid out row-major, so the tensor-parallel group of a rank is its neighbours on the
same node. The data degree is never taken from the spec as written: it is the attempt's world
size / (tensor × pipeline), so after a shrink to fewer nodes it is the smaller one.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod


class LayoutError(ValueError):
    """The declared layout cannot be built on this attempt's world."""


@dataclass(frozen=True)
class ParallelLayout:
    strategy: str  # parallel.strategy: ddp, fsdp or hybrid
    data: int  # data-parallel degree: world / (tensor × pipeline)
    tensor: int
    pipeline: int
    dim_names: tuple[str, ...]
    shape: tuple[int, ...]
    rank: int

    @classmethod
    def for_world(
        cls, strategy: str, tensor: int, pipeline: int, world_size: int, nodes: int, rank: int
    ) -> ParallelLayout:
        model_degree = tensor * pipeline
        if world_size % model_degree:
            raise LayoutError(
                f"parallel: tensor × pipeline = {model_degree} does not divide the world size {world_size}"
            )
        data = world_size // model_degree
        names: tuple[str, ...]
        if strategy == "hybrid":
            if data % nodes:
                raise LayoutError(
                    f"parallel.strategy: hybrid shards within a node, but the data degree {data} "
                    f"does not split evenly over {nodes} node(s)"
                )
            names, shape = ("dp_replicate", "dp_shard", "tp"), (nodes, data // nodes, tensor)
        else:
            names, shape = ("dp", "tp"), (data, tensor)
        if pipeline > 1:
            names, shape = ("pp", *names), (pipeline, *shape)
        return cls(strategy, data, tensor, pipeline, names, shape, rank)

    @property
    def world_size(self) -> int:
        return prod(self.shape)

    @property
    def data_rank(self) -> int:
        """This rank's index among the data-parallel ranks: the shard of the data it reads (every
        rank of one tensor-parallel group reads the same batch)."""
        coords = self.coordinates(self.rank)
        data_dims = [i for i, name in enumerate(self.dim_names) if name.startswith("dp")]
        index = 0
        for i in data_dims:
            index = index * self.shape[i] + coords[i]
        return index

    def coordinates(self, rank: int) -> tuple[int, ...]:
        coords = []
        for size in reversed(self.shape):
            coords.append(rank % size)
            rank //= size
        return tuple(reversed(coords))

    def degrees(self) -> dict[str, int]:
        return {
            "world_size": self.world_size,
            "dp_degree": self.data,
            "tp_degree": self.tensor,
            "pp_degree": self.pipeline,
            **{f"mesh_{n}": s for n, s in zip(self.dim_names, self.shape)},
        }

    def replica_groups(self, replicated: tuple[str, ...]) -> list[list[int]]:
        """Ranks that hold the same local values when the model is replicated along the `replicated`
        dimensions: those whose coordinates differ only there."""
        kept = [i for i, name in enumerate(self.dim_names) if name not in replicated]
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            coords = self.coordinates(rank)
            groups.setdefault(tuple(coords[i] for i in kept), []).append(rank)
        return list(groups.values())

    def build_mesh(self, device_type: str):
        """The DeviceMesh over every rank (collective: every rank builds it at the same point)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, self.shape, mesh_dim_names=self.dim_names)
