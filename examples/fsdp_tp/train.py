"""A small transformer trained with FSDP2 + tensor parallelism on the spec's 2-D mesh.

The layout comes from the spec, never from flags: `run.parallel` says the strategy and degrees and
`run.mesh` is the DeviceMesh with named dimensions ("dp", "tp"), or ("dp_replicate", "dp_shard",
"tp") for `strategy: hybrid` (HSDP). With `tensor: 1` the same script is plain FSDP2; with `strategy: ddp`
and a tensor degree equal to the world size it is tensor parallel alone.

    trainflow run examples/fsdp_tp/spec.yaml                               # 2 nodes x 2 processes: dp 2 x tp 2
    trainflow run examples/fsdp_tp/spec.yaml --set parallel.strategy=hybrid --set parallel.tensor=1
    trainflow run examples/fsdp_tp/spec.yaml --set resources.nodes=1 --set parallel.strategy=ddp  # TP only

CPU limits (gloo, torch 2.13): DTensor cannot run scaled_dot_product_attention on CPU. Its CPU
flash kernel (`_scaled_dot_product_flash_attention_for_cpu`, the default) has no sharding strategy,
the math kernel with `is_causal` mixes a plain mask with DTensors, and the efficient kernel is
CUDA only. So attention stays on local tensors (ColwiseParallel's default `use_local_output=True`):
each rank attends over its own heads with the ordinary CPU kernel; only the linear layers' weights
are DTensors. No mixed precision on CPU. The data is a
synthetic next-token task fixed by (seed, step), so nothing about the data needs checkpointing.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import trainflow.runtime as tf


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.wo = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # under tensor parallelism each rank holds dim/tp of q, k, v: its own share of the heads
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attn_norm, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.mlp_norm, self.w1, self.w2 = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.w2(F.gelu(self.w1(self.mlp_norm(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def tensor_parallel(model: TinyTransformer, tp_mesh) -> None:
    """Megatron-style: column-split q/k/v and the MLP's first layer, row-split what follows them."""
    plan = {
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(),
        "w1": ColwiseParallel(),
        "w2": RowwiseParallel(),
    }
    for block in model.blocks:
        parallelize_module(block, tp_mesh, plan)


def data_mesh(run: tf.Run):
    if run.parallel.strategy == "hybrid":
        return run.mesh["dp_replicate", "dp_shard"]  # HSDP: replicate across nodes, shard within
    return run.mesh["dp"]


def batch(step: int, seed: int, global_batch: int, seq: int, vocab: int, run: tf.Run):
    """This data-parallel rank's share of the step's global batch: sequences of an affine
    recurrence t[i+1] = (5 t[i] + 3) mod vocab; every rank of a tensor-parallel group gets the same."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    first = torch.randint(0, vocab, (global_batch, 1), generator=generator)
    steps = torch.arange(seq + 1)
    tokens = (first * (5**steps) + 3 * ((5**steps - 1) // 4)) % vocab
    mine = tokens[run.parallel.data_rank :: run.parallel.data]
    return mine[:, :-1], mine[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=32)  # model width; heads and 4*dim split over tp
    parser.add_argument("--heads", type=int, default=4)  # must be a multiple of parallel.tensor
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--global-batch", type=int, default=16)  # sequences per step across the data ranks
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    run = tf.init()
    torch.manual_seed(run.seed)  # the same initial weights on every rank, before any sharding
    model = TinyTransformer(args.vocab, args.dim, args.heads, args.layers, args.seq)
    if run.parallel.tensor > 1:
        tensor_parallel(model, run.mesh["tp"])
    if run.parallel.strategy in ("fsdp", "hybrid"):
        for block in model.blocks:
            fully_shard(block, mesh=data_mesh(run))
        fully_shard(model, mesh=data_mesh(run))
    elif run.parallel.data > 1:
        raise SystemExit("examples/fsdp_tp: with parallel.data > 1 declare strategy fsdp or hybrid (it shards over dp)")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    start = run.restore(model=model, optimizer=optimizer)
    for step in run.steps(start, samples_per_step=args.global_batch):
        inputs, targets = batch(step, run.seed, args.global_batch, args.seq, args.vocab, run)
        loss = F.cross_entropy(model(inputs).reshape(-1, args.vocab), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # the global batch's loss: the mean over every rank (ranks of a tensor-parallel group agree)
        reported = loss.detach().clone()
        dist.all_reduce(reported)
        run.log(loss=reported.item() / run.world_size)
    run.finish()


if __name__ == "__main__":
    main()
