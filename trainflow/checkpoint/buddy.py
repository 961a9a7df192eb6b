"""Buddy copies: each rank's files of a node-local checkpoint also go to a rank of the next node.

The node-local tier holds only what a node's own ranks wrote, so losing a node used to lose its
shards of every local checkpoint: the job went back to the newest snapshot in the checkpoint store
(`snapshot_every_s` ago). With a buddy copy every file of a local checkpoint is on two nodes, and a
restore after losing any one node still finds an intact copy of each on the nodes left
(runtime/restore.py gathers what a node lacks from whichever node holds it, checked against the
manifest's sha256).

Buddies follow the node order: the ranks of node k send to the ranks of the next node (the last
node's to the first), the i-th rank of a node to the i-th rank of the next. The files go as one
byte stream per pair, in chunks, with every pair's sends and receives posted before any is waited
for, so the ring never waits on itself. A file that cannot be read is sent as zeros and one that
cannot be written is still received in full: the streams stay in step whatever goes wrong on one
side, and a damaged copy fails its sha256 check at restore, where the other copy is taken.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from trainflow.checkpoint.manifest import FileEntry
from trainflow.checkpoint.storage import PARTIAL

CHUNK = 16 << 20


def buddies(nodes: dict[int, int]) -> dict[int, int]:
    """Every rank's buddy, the rank that holds a copy of its files (`nodes`: every rank's node);
    empty with one node."""
    by_node: dict[int, list[int]] = {}
    for rank in sorted(nodes):
        by_node.setdefault(nodes[rank], []).append(rank)
    order = sorted(by_node)
    if len(order) < 2:
        return {}
    pairs = {}
    for place, node in enumerate(order):
        following = by_node[order[(place + 1) % len(order)]]
        for index, rank in enumerate(by_node[node]):
            pairs[rank] = following[index % len(following)]
    return pairs


def copy_to_buddies(group, rank: int, nodes: dict[int, int], files: dict[int, list[FileEntry]], folder: Path) -> int:
    """Collective over `group` (every rank of `nodes` calls it): send this rank's files in `folder`
    to its buddy and write the files of the ranks it is the buddy of beside its own. `files`: every
    rank's files. Returns the bytes received; a file whose copy could not be written is left out."""
    pairs = buddies(nodes)
    if not pairs:
        return 0
    to = pairs[rank]
    senders = sorted(r for r, buddy in pairs.items() if buddy == rank)
    outgoing = _chunks(folder, files[rank])
    incoming = {sender: _Receiver(folder, files[sender]) for sender in senders}
    sending = _count(files[rank])
    rounds = max([sending, *(receiver.chunks for receiver in incoming.values())])
    for index in range(rounds):
        works, sent = [], None  # the chunk in flight stays referenced until its send is waited for
        if index < sending:
            sent = next(outgoing)
            works.append(dist.isend(sent, dst=to, group=group))
        buffers = {}
        for sender, receiver in incoming.items():
            if index < receiver.chunks:
                buffers[sender] = receiver.buffer(index)
                works.append(dist.irecv(buffers[sender], src=sender, group=group))
        for work in works:
            work.wait()
        del sent
        for sender, data in buffers.items():
            incoming[sender].write(data)
    return sum(receiver.finish() for receiver in incoming.values())


def _count(entries: list[FileEntry]) -> int:
    total = sum(e.size for e in entries)
    return -(-total // CHUNK)


def _chunks(folder: Path, entries: list[FileEntry]) -> Iterator[torch.Tensor]:
    """The files one after the other, as CHUNK-sized tensors (the last one shorter), read a chunk
    at a time: memory stays bounded whatever the shards' sizes."""
    pending = bytearray()
    for entry in entries:
        try:
            source = open(folder / entry.name, "rb")
        except OSError:
            source = None
        with source or nullcontext():
            left = entry.size
            while left:
                count = min(CHUNK - len(pending), left)
                data = source.read(count) if source is not None else b""
                pending += data + bytes(count - len(data))  # a short file is padded: the streams stay in step
                left -= count
                if len(pending) == CHUNK:
                    yield torch.frombuffer(pending, dtype=torch.uint8)
                    pending = bytearray()
    if pending:
        yield torch.frombuffer(pending, dtype=torch.uint8)


class _Receiver:
    """Writes one sender's stream back into its files, each under a partial name until complete."""

    def __init__(self, folder: Path, entries: list[FileEntry]):
        self.folder, self.entries = folder, entries
        self.total = sum(e.size for e in entries)
        self.chunks = _count(entries)
        self.received = 0
        self.broken: set[str] = set()  # files whose copy could not be written: left out
        for entry in entries:
            try:
                self._partial(entry.name).write_bytes(b"")
            except OSError:
                self.broken.add(entry.name)

    def buffer(self, index: int) -> torch.Tensor:
        return torch.empty(min(CHUNK, self.total - index * CHUNK), dtype=torch.uint8)

    def write(self, chunk: torch.Tensor) -> None:
        data = memoryview(chunk.numpy())
        start, end, place = self.received, self.received + len(data), 0
        for entry in self.entries:
            low, high = max(start, place), min(end, place + entry.size)
            if low < high and entry.name not in self.broken:
                try:
                    with open(self._partial(entry.name), "ab") as target:
                        target.write(data[low - start : high - start])
                except OSError:
                    self.broken.add(entry.name)
            place += entry.size
        self.received = end

    def finish(self) -> int:
        for entry in self.entries:
            partial = self._partial(entry.name)
            if entry.name not in self.broken:
                try:
                    os.replace(partial, self.folder / entry.name)
                    continue
                except OSError:
                    self.broken.add(entry.name)
            partial.unlink(missing_ok=True)
        return self.received

    def _partial(self, name: str) -> Path:
        return self.folder / f"{name}{PARTIAL}buddy-{os.getpid()}"
