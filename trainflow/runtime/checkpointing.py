"""Save and restore the training state: asynchronous, two tiers, verified, committed by a manifest.

The Checkpointer is what the runtime holds; its parts, one idea each:
- save.py: stage the state, write the node-local copy in the background, decide a snapshot;
- publish.py: upload every rank's files from its node, commit the manifest last (create-only);
- restore.py: the newest candidate that verifies, local copies before durable ones, older on failure;
- state_io.py: what a save captures and how a verified checkpoint is read back (JSON and DCP only);
- checkpoint_context.py: the rank, its own gloo group, the node's tier, the store and the events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainflow.checkpoint.local_tier import LocalTier
from trainflow.checkpoint.storage import Storage
from trainflow.runtime.checkpoint_context import CheckpointContext
from trainflow.runtime.restore import CheckpointInvalid, Restored, Restorer
from trainflow.runtime.save import BACKGROUND_NICENESS, SaveOutcome, Saver
from trainflow.runtime.state_io import Stateful, state_dicts
from trainflow.worker_config import WorkerConfig

__all__ = ["CheckpointInvalid", "Checkpointer", "Restored", "SaveOutcome", "Stateful"]


class Checkpointer:
    def __init__(
        self,
        config: WorkerConfig,
        storage: Storage,
        rank: int,
        world_size: int,
        local_rank: int = 0,
        send: Callable[[Any], None] | None = None,
        niceness: int = BACKGROUND_NICENESS,
        series: str = "",
    ):
        """`series`: names this run of the script's saves apart from an earlier run's in the same
        attempt (an in-process restart's round), the same on every rank."""
        self.ctx = CheckpointContext.create(config, storage, rank, world_size, local_rank, send)
        self._saver = Saver(self.ctx, niceness, series)
        self._restorer = Restorer(self.ctx)

    def save(self, step: int, state: Stateful, commit: bool = False) -> SaveOutcome:
        """Collective: every rank calls it for the same steps. Returns once the state is staged, or
        with `commit` once the checkpoint is committed to the checkpoint URI (StorageError if it
        could not be)."""
        return self._saver.save(step, state, commit)

    def wait(self) -> bool | None:
        """Wait for the save in flight; whether the last save is committed to the checkpoint URI."""
        return self._saver.wait()

    def close(self) -> None:
        """Wait for the save in flight, then stop the background thread."""
        self._saver.close()

    def abandon(self, within_s: float) -> bool:
        """Stop; False when the save in flight did not end within `within_s` (see Saver.abandon)."""
        return self._saver.abandon(within_s)

    def take_metrics(self) -> dict[str, float]:
        """Figures of the saves since the last call (rank 0 reports them with the next step)."""
        return self._saver.take_metrics()

    def restore(self, prefix: str | None, state: Stateful) -> Restored | None:
        """Collective. Load the newest checkpoint that verifies (see restore.py); None: start fresh."""
        return self._restorer.restore(prefix, state)

    @property
    def tier(self) -> LocalTier:
        """The node-local tier of this rank's node."""
        return self.ctx.tier

    def model_state(self, state: Stateful) -> dict[str, torch.Tensor]:
        return dict(state_dicts(state)[0])
