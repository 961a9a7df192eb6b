"""Run on one node inside a running job (`srun --overlap`): how the job's processes there look, and
their Python stacks. The orchestrator cannot see a compute node's processes; this reports them.

    python -m trainflow.backends.slurm.node_probe state RUN_ID    # running | workers-stopped | gone
    python -m trainflow.backends.slurm.node_probe stacks RUN_ID   # JSON {rank: stack text}
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil

from trainflow.worker_config import JOB_ENV

PY_SPY = Path(sys.executable).parent / "py-spy"


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
    dumped = {}
    for rank, proc in sorted(workers(run_id).items()):
        if not PY_SPY.exists():
            dumped[rank] = "py-spy is not installed on this node"
            continue
        try:
            result = subprocess.run([str(PY_SPY), "dump", "--pid", str(proc.pid)], capture_output=True,
                                    text=True, timeout=20)
            dumped[rank] = (result.stdout or result.stderr).strip()[-20000:]
        except subprocess.TimeoutExpired:
            dumped[rank] = "py-spy dump timed out"
    return dumped


if __name__ == "__main__":
    what, run = sys.argv[1], sys.argv[2]
    print(state(run) if what == "state" else json.dumps(stacks(run)))
