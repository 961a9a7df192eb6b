"""What srun starts on each node of an attempt: torchrun for this node, then its exit code in a file.

Slurm tells the orchestrator how the job ended, not how each node did; this file does. Signals from
Slurm (a preemption's SIGTERM, the time limit's warning) reach every process of the step, so the
agent only notes the first one and when it came (the orchestrator tells the time limit's warning
from other signals by it) and keeps waiting for torchrun, which ends its workers itself.

    python -m trainflow.backends.slurm.node_agent ATTEMPT_DIR
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainflow.backends.bounded_output import LOG_LIMIT_ENV, RANK_STDERR_ENV, torchrun_log_dir
from trainflow.worker_config import CONFIG_ENV

LAUNCH_FILE = "launch.json"
RDZV_ENV = "TRAINFLOW_RDZV_ENDPOINT"


def exit_file(attempt_dir: Path, node: int) -> Path:
    return attempt_dir / f"node-{node}.exit"


def signal_file(attempt_dir: Path, node: int) -> Path:
    """The first signal Slurm sent this node's step, and when: `TERM 1764588000.25`."""
    return attempt_dir / f"node-{node}.signal"


def read_signal(attempt_dir: Path, node: int) -> tuple[str, float] | None:
    try:
        name, at = signal_file(attempt_dir, node).read_text().split()
        return name, float(at)
    except (OSError, ValueError):
        return None


def output_environment(launch: dict, attempt_dir: Path, node: int) -> dict[str, str]:
    """What bounds this node's log (srun's `node-%n.log`) and keeps each rank's last stderr lines
    (bounded_output.py)."""
    return {LOG_LIMIT_ENV: str(launch["node_log_max_bytes"]), RANK_STDERR_ENV: str(torchrun_log_dir(attempt_dir, node))}


def torchrun_command(launch: dict, node: int, endpoint: str, attempt_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainflow.backends.agent",
        "--nnodes",
        str(launch["nodes"]),
        "--nproc-per-node",
        str(launch["procs_per_node"]),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        launch["rdzv_id"],
        "--rdzv-conf",
        f"is_host={'true' if node == 0 else 'false'}",
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        "--log-dir",
        str(torchrun_log_dir(attempt_dir, node)),
        launch["entrypoint"],
        *launch["args"],
    ]


def main(attempt_dir: Path) -> int:
    node = int(os.environ["SLURM_NODEID"])
    launch = json.loads((attempt_dir / LAUNCH_FILE).read_text())
    env = {
        **os.environ,
        CONFIG_ENV: str(attempt_dir / f"node-{node}.json"),
        **output_environment(launch, attempt_dir, node),
    }
    noted = signal_file(attempt_dir, node)

    def note(number: int, _frame) -> None:
        if not noted.exists():
            noted.write_text(f"{signal.Signals(number).name.removeprefix('SIG')} {time.time()}")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, note)
    proc = subprocess.Popen(torchrun_command(launch, node, os.environ[RDZV_ENV], attempt_dir), env=env)
    while True:
        try:
            code = proc.wait()
            break
        except InterruptedError:
            continue
    exit_file(attempt_dir, node).write_text(str(code))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
