"""What copying a plain script's checkpoint folder costs, against the bytes moved by hand.

trainflow's copy (trainflow/checkpoint/plain_copies.py: copied aside, checked unchanged, hashed,
uploaded, manifest committed) and a restore (downloaded, size and sha256 checked, renamed into
place), each against a bare `shutil.copyfile` of the same file to the same disk, interleaved
rounds, medians; the ratio is the median of the rounds' ratios.

    .venv/bin/python bench/plain_copy.py [--size-mb 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from trainflow.checkpoint.plain_copies import CopyIdentity, folder_state, restore_newest, take_copy
from trainflow.checkpoint.storage import LocalStorage


def timed(action) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainflow-plain-copy-") as root:
        root = Path(root)
        out = root / "out"
        out.mkdir()
        (out / "ckpt.pt").write_bytes(os.urandom(args.size_mb << 20))
        storage = LocalStorage(root / "store")
        rows = []
        for round_ in range(args.rounds):
            bare_copy = root / f"bare-{round_}.pt"
            bare = timed(lambda bare_copy=bare_copy: shutil.copyfile(out / "ckpt.pt", bare_copy))
            copy = None

            def take():
                nonlocal copy
                copy = take_copy(
                    out, folder_state(out), storage, CopyIdentity("run", 2, "spec", "code"), root / "aside"
                )

            copied = timed(take)
            restore_to = root / f"restored-{round_}"
            taken = copy
            restored = timed(
                lambda taken=taken, restore_to=restore_to: restore_newest(storage, taken.prefix, restore_to)
            )
            rows.append((bare, copied, restored))
            (root / f"bare-{round_}.pt").unlink()
            shutil.rmtree(restore_to)
        bare, copied, restored = (statistics.median(column) for column in zip(*rows))
        print(f"plain copy of a {args.size_mb} MB folder, {args.rounds} rounds (medians):")
        print(f"  bare copyfile      {bare:.3f} s ({args.size_mb / bare:.0f} MB/s)")
        print(
            f"  trainflow copy     {copied:.3f} s, {statistics.median(c / b for b, c, _ in rows):.2f} x bare "
            "(copy aside, hash, upload, commit)"
        )
        print(
            f"  trainflow restore  {restored:.3f} s, {statistics.median(r / b for b, _, r in rows):.2f} x bare "
            "(download, verify, rename)"
        )


if __name__ == "__main__":
    main()
