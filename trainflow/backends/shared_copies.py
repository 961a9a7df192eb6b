"""The node's shared-memory folder for its ranks' in-memory copies (runtime/memory_copy.py): made by
the node's agent for an attempt with in-process restart, where a rank's copies outlive its process,
so that the process started in its place (backends/rank_replacement.py) goes on from them.

It lies in /dev/shm (memory, not disk: a copy is a memcpy) under a random name made by `mkdtemp`
(0700), since everyone can write there. Its path reaches the ranks through their environment, and
is recorded in the node's scratch folder: the agent removes it as it exits, and teardown removes
what an agent killed outright recorded (`remove_recorded`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from trainflow.worker_config import MEMORY_COPIES_ENV

SHM = Path("/dev/shm")
PREFIX = "trainflow-copies-"
RECORD = "memory-copies"


def make_for_node(node_scratch: Path, attempt: int) -> Path | None:
    """The node's folder, announced to its ranks through the environment; None where this machine
    has no shared memory to make it in (the copies then stay in each rank's own memory)."""
    try:
        folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=SHM))
    except OSError:
        return None
    (node_scratch / f"{RECORD}-{attempt}").write_text(str(folder))
    os.environ[MEMORY_COPIES_ENV] = str(folder)
    return folder


def remove(folder: Path | None) -> None:
    if folder is not None and folder.parent == SHM and folder.name.startswith(PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


def remove_recorded(scratch: Path) -> list[str]:
    """Teardown: the folders the nodes of the run whose scratch folder is `scratch` recorded."""
    removed = []
    for record in scratch.glob(f"node-*/{RECORD}-*"):
        try:
            folder = Path(record.read_text().strip())
        except OSError:
            continue
        if folder.exists():
            remove(folder)
            removed.append(str(folder))
    return removed
