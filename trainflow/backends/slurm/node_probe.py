"""Run on one node inside a running job (`srun --overlap`): how the job's processes there look, and
their Python stacks. The orchestrator cannot see a compute node's processes; this reports them.

    python -m trainflow.backends.slurm.node_probe state RUN_ID    # running | workers-stopped | gone
    python -m trainflow.backends.slurm.node_probe stacks RUN_ID   # JSON {rank: stack text}
"""

from __future__ import annotations

import json
import sys

import psutil

from trainflow.backends.stacks import py_spy_dump
from trainflow.worker_config import JOB_ENV


def workers(run_id: str) -> dict[int, psutil.Process]:
    """The job's worker processes on this node, by global rank (torchrun sets RANK)."""
    found = {}
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get(JOB_ENV) == run_id and "RANK" in env and "LOCAL_RANK" in env:
                found[int(env["RANK"])] = proc
        except (psutil.Error, ValueError):
            continue
    return found


def state(run_id: str) -> str:
    found = workers(run_id)
    try:
        if not found:
            return "gone"
        if any(p.status() == psutil.STATUS_STOPPED for p in found.values()):
            return "workers-stopped"
    except psutil.Error:
        return "gone"
    return "running"


def stacks(run_id: str) -> dict[int, str]:
    return {
        rank: py_spy_dump(proc.pid, missing="py-spy is not installed on this node")
        for rank, proc in sorted(workers(run_id).items())
    }


if __name__ == "__main__":
    what, run = sys.argv[1], sys.argv[2]
    print(state(run) if what == "state" else json.dumps(stacks(run)))
