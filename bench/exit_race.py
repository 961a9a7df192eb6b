"""How often torch 2.13's gloo deadlocks or aborts a DDP rank at exit, for ranks forked from a
process that imported given modules first (as a warm worker's zygote does) or started as new
interpreters.

Each trial starts two ranks on a FileStore; each trains a few DDP steps, calls `dist.barrier()`,
then ends as the script being modelled ends, with `os._exit(0)` once main() returns, or (new
interpreters only) through the interpreter's own exit with RACE_EXIT=interpreter. A trial whose
ranks have not exited within --deadline-s counts as deadlocked, and its ranks are killed; one
whose rank exited other than 0 (gloo's abort) as failed. Not part of `make bench`: a few hundred
trials take minutes.

    python bench/exit_race.py --trials 200 --preload torch torch._dynamo
    python bench/exit_race.py --trials 200 --preload torch --ending free-model-first
    python bench/exit_race.py --trials 200 --preload torch torch._dynamo --ending trainflow-finish
    RACE_EXIT=interpreter python bench/exit_race.py --trials 50 --new-interpreters --ending trainflow-finish
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
from collections import Counter
from pathlib import Path

RANK = """
import os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainflow.runtime.leave_groups import leave_process_groups


def main(ending):
    dist.init_process_group("gloo", store=dist.FileStore(os.environ["RACE_STORE"], 2),
                            rank=int(os.environ["RACE_RANK"]), world_size=2)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if ending == "trainflow-finish":  # as Run.finish() leaves
        leave_process_groups()
        return
    dist.barrier()
    if ending == "free-model-first":
        del model, optimizer, loss
    dist.destroy_process_group()  # the model, and with it maybe the group's last reference, goes at return


main(sys.argv[1])
if os.environ.get("RACE_EXIT") != "interpreter":
    os._exit(0)
"""


ENDINGS = ("model-at-return", "free-model-first", "trainflow-finish")


def forked_rank(script: Path, store: str, rank: int, ending: str) -> int:
    pid = os.fork()
    if pid == 0:
        os.environ.update(RACE_STORE=store, RACE_RANK=str(rank))
        os.environ.pop("RACE_EXIT", None)  # a fork cannot return into this bench: it ends with os._exit
        sys.argv = [str(script), ending]
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            os._exit(1)
    return pid


def wait_all(pids: list[int], deadline_s: float) -> tuple[list[int], int]:
    """The pids still running at the deadline, and how many of the others exited other than 0."""
    left, failed, deadline = set(pids), 0, time.monotonic() + deadline_s
    while left and time.monotonic() < deadline:
        for pid in list(left):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                left.discard(pid)
                failed += os.waitstatus_to_exitcode(status) != 0
        time.sleep(0.01)
    return sorted(left), failed


def trial(script: Path, store: str, ending: str, new_interpreters: bool, deadline_s: float) -> str:
    """ "deadlocked" (a rank still running at the deadline), "failed" (a rank exited other than 0:
    gloo's abort at exit) or "clean"."""
    if new_interpreters:
        ranks = [
            subprocess.Popen(
                [sys.executable, str(script), ending], env={**os.environ, "RACE_STORE": store, "RACE_RANK": str(rank)}
            )
            for rank in range(2)
        ]
        start_up = 30.0  # each new interpreter imports torch first
        pids = [r.pid for r in ranks]
        stuck, failed = wait_all(pids, deadline_s + start_up)
    else:
        pids = [forked_rank(script, store, rank, ending) for rank in range(2)]
        stuck, failed = wait_all(pids, deadline_s)
    for pid in stuck:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return "deadlocked" if stuck else "failed" if failed else "clean"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--preload", nargs="*", default=[], help="modules imported before the forks")
    parser.add_argument("--new-interpreters", action="store_true", help="start each rank as a new python")
    parser.add_argument(
        "--ending",
        choices=ENDINGS,
        default=ENDINGS[0],
        help=(
            "how the script ends: its model freed when main() returns, after destroy_process_group(); "
            "freed first; or leaving the groups as trainflow's Run.finish() does"
        ),
    )
    parser.add_argument("--deadline-s", type=float, default=5.0)
    args = parser.parse_args()
    for name in args.preload:
        importlib.import_module(name)
    ending = args.ending
    with tempfile.TemporaryDirectory(prefix="exit-race-") as folder:
        script = Path(folder) / "rank.py"
        script.write_text(RANK)
        started, outcomes = time.monotonic(), Counter()
        for index in range(args.trials):
            store = str(Path(folder) / f"store-{index}")
            outcomes[trial(script, store, ending, args.new_interpreters, args.deadline_s)] += 1
            Path(store).unlink(missing_ok=True)
    how = "new interpreters" if args.new_interpreters else f"forked after importing {args.preload or 'nothing'}"
    exit_how = (
        "the interpreter's exit"
        if args.new_interpreters and os.environ.get("RACE_EXIT") == "interpreter"
        else "os._exit(0)"
    )
    print(
        f"{how}, {ending}, {exit_how}: of {args.trials} trials {outcomes['deadlocked']} deadlocked, "
        f"{outcomes['failed']} had a rank exit other than 0 ({time.monotonic() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
