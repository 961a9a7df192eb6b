"""What the checkpointer's parts share: who this rank is, its own gloo group, the node's tier, the
checkpoint store, and the events it sends the orchestrator."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from trainflow.checkpoint.local_tier import LocalTier
from trainflow.checkpoint.storage import Storage
from trainflow.contracts.status_protocol import Storage as StorageCall
from trainflow.worker_config import WorkerConfig


def warn(message: str) -> None:
    print(f"trainflow: {message}", file=sys.stderr, flush=True)  # the node's log


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]


def _ignore(kind: str, **fields: Any) -> None:
    pass


@dataclass
class CheckpointContext:
    config: WorkerConfig
    storage: Storage
    rank: int
    world_size: int
    leader: bool  # the node's first rank reads and writes the node's tier
    send: Callable[[Any], None]  # events to the orchestrator (status_protocol messages)
    tier: LocalTier
    group: Any  # background saves run collectives; a group of their own keeps them apart from training's

    @classmethod
    def create(
        cls,
        config: WorkerConfig,
        storage: Storage,
        rank: int,
        world_size: int,
        local_rank: int,
        send: Callable[[Any], None] | None,
    ) -> CheckpointContext:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=config.collective_timeout_s))
        tier = LocalTier(Path(config.node_scratch) / "checkpoints")
        return cls(config, storage, rank, world_size, local_rank == 0, send or _ignore, tier, group)

    @property
    def scratch(self) -> Path:
        return Path(self.config.node_scratch)

    def all_gather(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value, group=self.group)
        return gathered

    def broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    @contextmanager
    def storage_call(self, call: str) -> Iterator[None]:
        """Tell the orchestrator training is blocked on the checkpoint store, and when it is not any
        more: a stall in a storage call is a storage outage, not a hang of the training."""
        since = time.time()
        self.send(StorageCall(state="waiting", since=since, call=call))
        try:
            yield
        finally:
            self.send(StorageCall(state="done", since=since, call=call))
