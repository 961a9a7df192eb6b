"""How long torchrun alone takes to bring a dead worker back, restoring nothing: the yardstick
for trainflow's recovery time, measured on this machine in the same run.

The worker joins a gloo process group, reports its first step, and in its first incarnation
kills itself right after; torchrun (--max-restarts 1) restarts it. The figure is the time from
the kill to the restarted worker's first step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = """
import json, os, signal, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(4)
dist.all_reduce(x)
record = {"restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]), "first_step_at": time.time()}
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(record) + "\\n")
if record["restart"] == 0:
    with open(sys.argv[1], "a") as log:
        log.write(json.dumps({"killed_at": time.time()}) + "\\n")
    os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
"""


def measure_torchrun_restart(timeout_s: float = 120) -> float:
    """Seconds from a worker's death to its restarted incarnation's first step under torchrun."""
    with tempfile.TemporaryDirectory(prefix="trainflow-torchrun-") as folder:
        script, log = Path(folder) / "worker.py", Path(folder) / "events.jsonl"
        script.write_text(WORKER)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "1",
                "--max-restarts",
                "1",
                "--monitor-interval",
                "0.1",
                "--log-dir",
                str(Path(folder) / "torchrun"),
                str(script),
                str(log),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError("torchrun restart measurement timed out") from None
        events = [json.loads(line) for line in log.read_text().splitlines()]
    killed = next(e["killed_at"] for e in events if "killed_at" in e)
    restarted = next(e["first_step_at"] for e in events if e.get("restart") == 1)
    return restarted - killed


if __name__ == "__main__":
    print(json.dumps({"torchrun_restart_s": round(measure_torchrun_restart(), 3)}))
