"""Buddy copies: every rank's files of a local checkpoint reach a rank of the next node, over real
gloo ranks, byte for byte, whatever their sizes (across chunk boundaries, empty files), and a file
that cannot be read arrives as zeros of its size instead of stopping the ring."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch.distributed as dist

from tests.spawned_ranks import free_port, run_ranks
from trainflow.checkpoint import buddy
from trainflow.checkpoint.manifest import FileEntry

NODES = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}  # three nodes of two ranks


def test_each_rank_sends_to_its_place_on_the_next_node_and_the_last_node_to_the_first():
    assert buddy.buddies(NODES) == {0: 2, 1: 3, 2: 4, 3: 5, 4: 0, 5: 1}
    assert buddy.buddies({0: 0, 1: 0}) == {}  # one node: no buddy
    assert buddy.buddies({0: 0, 1: 0, 2: 1}) == {0: 2, 1: 2, 2: 0}


def _sizes(rank: int) -> list[int]:
    # one file spans several chunks, one is empty, one ends mid-chunk
    return [buddy.CHUNK * 2 + 17 * (rank + 1), 0, 1000 + rank]


def _exchange(rank: int, port: int, root: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(NODES))
    folder = Path(root) / f"node-{NODES[rank]}"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for r in NODES:
        entries = []
        for index, size in enumerate(_sizes(r)):
            data = bytes([(r * 31 + index * 7 + i) % 251 for i in range(min(size, 4096))]) * (size // 4096 + 1)
            data = data[:size]
            name = f"__{r}_{index}.distcp"
            if r == rank:
                if not (rank == 5 and index == 2):  # rank 5 lost this file: it goes as zeros
                    (folder / name).write_bytes(data)
            entries.append(FileEntry(name, size, hashlib.sha256(data).hexdigest()))
        files[r] = entries
    received = buddy.copy_to_buddies(dist.group.WORLD, rank, NODES, files, folder)
    dist.barrier()
    sender = next(r for r, to in buddy.buddies(NODES).items() if to == rank)
    results[rank] = {
        "received": received,
        "sender": sender,
        "intact": [hashlib.sha256((folder / e.name).read_bytes()).hexdigest() == e.sha256 for e in files[sender]],
        "sizes": [(folder / e.name).stat().st_size for e in files[sender]],
        "leftovers": sorted(p.name for p in folder.iterdir() if ".partial-" in p.name),
    }
    dist.destroy_process_group()


def test_every_ranks_files_reach_its_buddy_intact(tmp_path):
    results = run_ranks(_exchange, (free_port(), str(tmp_path)), len(NODES))
    for rank, got in results.items():
        sender = got["sender"]
        assert got["received"] == sum(_sizes(sender))
        assert got["sizes"] == _sizes(sender)
        assert got["leftovers"] == []
        expected = [True, True, sender != 5]  # rank 5's unreadable file arrives as zeros, caught by its hash
        assert got["intact"] == expected, (rank, got)
