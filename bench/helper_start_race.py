"""How long a rank's upload helper takes to start from a background thread while the training thread
forks short-lived children (a DataLoader starting its workers): through TransferAgent, whose start
forks wait for, and through a plain Popen of the same command, which a fork can catch half-done.
Not part of `make bench`; it measures the race that docs/checkpoints.md describes.

    python bench/helper_start_race.py --starts 40 --child-lives-s 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

from trainflow.checkpoint.transfer_agent import TransferAgent

URI = "s3://bench-bucket/helper-start"  # never contacted: the helper only starts and exits


def start_guarded() -> float:
    agent = TransferAgent(URI)
    began = time.perf_counter()
    agent._start()
    took = time.perf_counter() - began
    agent.close()
    return took


def start_plain() -> float:
    began = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainflow.checkpoint.transfer_agent", URI, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    took = time.perf_counter() - began
    proc.stdin.write('{"op": "exit"}\n')
    proc.stdin.close()
    proc.wait(30)
    return took


def measure(start, starts: int, child_lives_s: float) -> list[float]:
    """Start the helper `starts` times from a thread while this thread forks children."""
    done = threading.Event()
    times: list[float] = []

    def starter() -> None:
        for _ in range(starts):
            times.append(start())
        done.set()

    thread = threading.Thread(target=starter)
    thread.start()
    children: list[int] = []
    while not done.is_set():
        pid = os.fork()
        if pid == 0:
            time.sleep(child_lives_s)
            os._exit(0)
        children.append(pid)
        time.sleep(0.002)
        children = [c for c in children if os.waitpid(c, os.WNOHANG) == (0, 0)]
    thread.join()
    for child in children:
        os.waitpid(child, 0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--child-lives-s", type=float, default=1.0)
    args = parser.parse_args()
    for name, start in (("TransferAgent (forks wait)", start_guarded), ("plain Popen", start_plain)):
        times = measure(start, args.starts, args.child_lives_s)
        slow = sum(t > args.child_lives_s / 2 for t in times)
        print(
            f"{name}: {len(times)} starts, median {statistics.median(times) * 1000:.1f} ms, "
            f"max {max(times):.2f} s, {slow} took over {args.child_lives_s / 2:g} s"
        )


if __name__ == "__main__":
    main()
