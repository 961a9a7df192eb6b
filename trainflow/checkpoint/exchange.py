"""Moving a checkpoint's files between nodes over a process group, for restores from the local tier.

Each node's local tier holds only its own ranks' files; restoring from it means every node first
gets the files it lacks from a node that holds a verified copy. A file goes as a series of
broadcasts from its holder (everyone in the group takes part; only the nodes that need it write
it), in chunks so memory stays bounded.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from trainflow.checkpoint.storage import PARTIAL

CHUNK = 64 << 20


def broadcast_file(group, source: int, path: Path, size: int, receive: bool) -> None:
    """Collective: rank `source` sends `path`; ranks with `receive` write it to `path`, others discard."""
    me = dist.get_rank()
    sender = me == source
    partial = path.with_name(f"{path.name}{PARTIAL}{os.getpid()}") if receive and not sender else None
    if partial is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    reader = open(path, "rb") if sender else None
    writer = open(partial, "wb") if partial is not None else None
    try:
        offset = 0
        while offset < size:
            count = min(CHUNK, size - offset)
            if sender:
                # a file that shrank since it was verified is padded, never cut short: the others
                # stay in step with the broadcasts, and their sha256 check rejects the copy
                data = bytearray(reader.read(count))
                data.extend(bytes(count - len(data)))
                chunk = torch.frombuffer(data, dtype=torch.uint8)
            else:
                chunk = torch.empty(count, dtype=torch.uint8)
            dist.broadcast(chunk, src=source, group=group)
            if writer is not None:
                writer.write(memoryview(chunk.numpy()))
            offset += count
    finally:
        if reader is not None:
            reader.close()
        if writer is not None:
            writer.close()
    if partial is not None:
        os.replace(partial, path)
