"""How often torch 2.13's gloo deadlocks a DDP rank at exit, for ranks forked from a process that
imported given modules first (as a warm worker's zygote does) or started as new interpreters.

Each trial starts two ranks on a FileStore; each trains a few DDP steps, calls `dist.barrier()`,
then ends as the script being modelled ends. A trial whose ranks have not exited within
--deadline-s counts as deadlocked, and its ranks are killed. Not part of `make bench`: a few
hundred trials take minutes.

    python bench/exit_race.py --trials 200 --preload torch torch._dynamo
    python bench/exit_race.py --trials 200 --preload torch --free-model-first
    python bench/exit_race.py --trials 50 --new-interpreters
"""

from __future__ import annotations

import argparse
import importlib
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK = '''
import os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(free_model_first):
    dist.init_process_group("gloo", store=dist.FileStore(os.environ["RACE_STORE"], 2),
                            rank=int(os.environ["RACE_RANK"]), world_size=2)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.barrier()
    if free_model_first:
        del model, optimizer, loss
    dist.destroy_process_group()  # otherwise the model, and with it the group, goes at return


main(sys.argv[1] == "free-model-first")
os._exit(0)
'''


def forked_rank(script: Path, store: str, rank: int, ending: str) -> int:
    pid = os.fork()
    if pid == 0:
        os.environ.update(RACE_STORE=store, RACE_RANK=str(rank))
        sys.argv = [str(script), ending]
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            os._exit(1)
    return pid


def wait_all(pids: list[int], deadline_s: float) -> list[int]:
    """The pids still running at the deadline."""
    left, deadline = set(pids), time.monotonic() + deadline_s
    while left and time.monotonic() < deadline:
        for pid in list(left):
            if os.waitpid(pid, os.WNOHANG)[0]:
                left.discard(pid)
        time.sleep(0.01)
    return sorted(left)


def trial(script: Path, store: str, ending: str, new_interpreters: bool, deadline_s: float) -> bool:
    """Whether the trial deadlocked."""
    if new_interpreters:
        ranks = [subprocess.Popen([sys.executable, str(script), ending],
                                  env={**os.environ, "RACE_STORE": store, "RACE_RANK": str(rank)})
                 for rank in range(2)]
        start_up = 30.0  # each new interpreter imports torch first
        stuck = wait_all([r.pid for r in ranks], deadline_s + start_up)
        for rank in ranks:
            if rank.pid in stuck:
                rank.kill()
            rank.wait()
        return bool(stuck)
    stuck = wait_all([forked_rank(script, store, rank, ending) for rank in range(2)], deadline_s)
    for pid in stuck:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return bool(stuck)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--preload", nargs="*", default=[], help="modules imported before the forks")
    parser.add_argument("--new-interpreters", action="store_true", help="start each rank as a new python")
    parser.add_argument("--free-model-first", action="store_true", help="the script frees its model first")
    parser.add_argument("--deadline-s", type=float, default=5.0)
    args = parser.parse_args()
    for name in args.preload:
        importlib.import_module(name)
    ending = "free-model-first" if args.free_model_first else "model-at-return"
    with tempfile.TemporaryDirectory(prefix="exit-race-") as folder:
        script = Path(folder) / "rank.py"
        script.write_text(RANK)
        started, deadlocked = time.monotonic(), 0
        for index in range(args.trials):
            store = str(Path(folder) / f"store-{index}")
            deadlocked += trial(script, store, ending, args.new_interpreters, args.deadline_s)
            Path(store).unlink(missing_ok=True)
    how = "new interpreters" if args.new_interpreters else f"forked after importing {args.preload or 'nothing'}"
    print(f"{how}, {ending}: {deadlocked} of {args.trials} trials deadlocked "
          f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
