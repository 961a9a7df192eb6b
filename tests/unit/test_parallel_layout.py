"""The spec's layout in the script's hands: named mesh dimensions, degrees from the attempt's world
size, replica groups, and the sharding read back from a real (one-rank) FSDP2 / TP model."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

from trainflow.backends.ports import free_port
from trainflow.runtime.layout import LayoutError, ParallelLayout
from trainflow.runtime.sharding import layout_warnings, replicated_dims
from trainflow.runtime.state import full_params_sha256, local_params_hash, params_sha256


def layout(strategy: str = "fsdp", tensor: int = 1, pipeline: int = 1, world: int = 8, nodes: int = 2, rank: int = 0):
    return ParallelLayout.for_world(strategy, tensor, pipeline, world, nodes, rank)


def test_mesh_dimensions_are_named_and_the_data_degree_follows_the_world():
    two_d = layout("fsdp", tensor=2)
    assert (two_d.dim_names, two_d.shape, two_d.data) == (("dp", "tp"), (4, 2), 4)
    shrunk = layout("fsdp", tensor=2, world=4, nodes=1)
    assert shrunk.data == 2 and shrunk.degrees()["dp_degree"] == 2
    hsdp = layout("hybrid", tensor=2)
    assert (hsdp.dim_names, hsdp.shape) == (("dp_replicate", "dp_shard", "tp"), (2, 2, 2))
    assert layout("ddp", pipeline=2).dim_names == ("pp", "dp", "tp")


def test_ranks_of_a_tensor_parallel_group_read_the_same_data_shard():
    ranks = [layout("fsdp", tensor=2, rank=r) for r in range(8)]
    assert [r.data_rank for r in ranks] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [layout("hybrid", tensor=2, rank=r).data_rank for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_layouts_the_world_cannot_hold_are_refused_naming_the_field():
    with pytest.raises(LayoutError, match="parallel: tensor × pipeline = 3 does not divide the world size 8"):
        layout(tensor=3)
    with pytest.raises(LayoutError, match="parallel.strategy: hybrid"):
        layout("hybrid", world=6, nodes=4)


def test_replicas_are_only_the_ranks_that_differ_along_replicated_dimensions():
    hsdp = layout("hybrid", tensor=2)  # (2, 2, 2): rank = 4 r + 2 s + t
    assert sorted(hsdp.replica_groups(("dp_replicate",))) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout("ddp").replica_groups(("dp", "tp")) == [list(range(8))]
    assert all(len(g) == 1 for g in layout("fsdp", tensor=2).replica_groups(()))


@pytest.fixture(scope="module")
def one_rank():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield ParallelLayout.for_world("fsdp", 1, 1, 1, 1, 0)
    dist.destroy_process_group()


def mlp() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))


def test_the_full_hash_is_the_same_for_every_layout_of_one_model(one_rank):
    mesh = one_rank.build_mesh("cpu")
    plain = full_params_sha256(mlp())
    assert plain == params_sha256(dict(mlp().state_dict()))
    assert full_params_sha256(DDP(mlp())) == plain  # no `module.` prefix
    sharded = mlp()
    fully_shard(sharded, mesh=mesh["dp"])
    assert full_params_sha256(sharded) == plain
    tensor_parallel = mlp()
    parallelize_module(tensor_parallel, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert full_params_sha256(tensor_parallel) == plain
    assert local_params_hash(sharded) == local_params_hash(tensor_parallel)  # one rank holds everything


def test_sharding_read_from_the_model_and_contradictions_named(one_rank):
    mesh = one_rank.build_mesh("cpu")
    sharded = mlp()
    fully_shard(sharded, mesh=mesh["dp"])
    assert replicated_dims(sharded, one_rank) == ("tp",)
    assert layout_warnings(sharded, one_rank) == []
    assert replicated_dims(DDP(mlp()), one_rank) == ("dp", "tp")
    declared = ParallelLayout("fsdp", data=2, tensor=2, pipeline=1, dim_names=("dp", "tp"), shape=(2, 2), rank=0)
    warnings = layout_warnings(DDP(mlp()), declared)
    assert any(w.startswith("parallel.strategy: fsdp") for w in warnings)
    assert any(w.startswith("parallel.tensor: 2") for w in warnings)
    assert any(
        w.startswith("parallel.strategy: ddp")
        for w in layout_warnings(sharded, ParallelLayout("ddp", 1, 1, 1, ("dp", "tp"), (1, 1), 0))
    )


def test_a_hash_of_whole_tensors_refuses_a_shard(one_rank):
    sharded = mlp()
    fully_shard(sharded, mesh=one_rank.build_mesh("cpu")["dp"])
    with pytest.raises(TypeError, match="full_params_sha256"):
        params_sha256(dict(sharded.named_parameters()))


def test_hybrid_that_cannot_shard_within_a_node_is_refused_at_validation():
    from trainflow.runspec import SpecError, load_spec

    overrides = ["resources.nodes=2", "resources.procs_per_node=1", "parallel.strategy=hybrid", "parallel.tensor=2"]
    with pytest.raises(SpecError, match="parallel.strategy: hybrid shards within a node"):
        load_spec("examples/fsdp_tp/spec.yaml", overrides)
    assert load_spec("examples/fsdp_tp/spec.yaml", ["parallel.strategy=hybrid"]).parallel.data == 2
