"""The newest state is never deleted before it is durable: before teardown removes the node
scratch, a node-local checkpoint newer than the checkpoint store's newest verified one (the only
copy of that state) is moved out of the scratch, under `<home>/kept/<run id>/`, and reported."""

from __future__ import annotations

import shutil
from pathlib import Path

from trainflow.checkpoint.local_tier import LocalTier

TIER_FOLDER = "checkpoints"  # <node scratch>/checkpoints is each node's tier (trainflow.runtime)


def newer_local_checkpoints(scratch: Path, run_id: str, durable_step: int | None) -> list[Path]:
    """Every node's newest committed local checkpoint folder of the run, if its step is past
    `durable_step` (None: nothing is known to be durable)."""
    committed = (
        {
            node: LocalTier(node / TIER_FOLDER).committed(run_id)
            for node in sorted(scratch.iterdir())
            if (node / TIER_FOLDER).is_dir()
        }
        if scratch.is_dir()
        else {}
    )
    newest = max((held[-1].step for held in committed.values() if held), default=None)
    if newest is None or (durable_step is not None and newest <= durable_step):
        return []
    # a step saved again by a later attempt: its newest save is the one to keep
    return [
        node / TIER_FOLDER / held[-1].prefix for node, held in committed.items() if held and held[-1].step == newest
    ]


def keep_newer_local_checkpoints(scratch: Path, run_id: str, durable_step: int | None, destination: Path) -> list[str]:
    """Move those folders to `destination/<node>/<checkpoint>`; returns where they now are."""
    kept = []
    for folder in newer_local_checkpoints(scratch, run_id, durable_step):
        target = destination / folder.parents[2].name / folder.name
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.move(str(folder), target)
        kept.append(str(target))
    return kept
