"""The sbatch command and batch script of one attempt: one job, one `srun` step with one node agent
(torchrun) per node, rendezvous on the job's first node at a port picked there for this job."""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
from pathlib import Path

from trainflow.backends.slurm.config import slurm_config
from trainflow.backends.slurm.node_agent import RDZV_ENV
from trainflow.runspec import RunSpec

_UNITS = {
    "": 1 / 2**20,
    "K": 1e3 / 2**20,
    "M": 1e6 / 2**20,
    "G": 1e9 / 2**20,
    "T": 1e12 / 2**20,
    "Ki": 1 / 2**10,
    "Mi": 1,
    "Gi": 2**10,
    "Ti": 2**20,
}


def job_name(run_id: str) -> str:
    return f"trainflow-{run_id}"


def memory_mb(quantity: str) -> int:
    """resources.memory (a Kubernetes quantity, e.g. 2Gi) in Slurm's megabytes (MiB)."""
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", quantity).groups()
    return max(1, math.ceil(float(number) * _UNITS[unit]))


def sbatch_command(spec: RunSpec, run_id: str, attempt_dir: Path, exclude: list[str]) -> list[str]:
    res, slurm = spec.resources, slurm_config(spec)
    command = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name(run_id)}",
        f"--nodes={res.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={math.ceil(res.cpu)}",
        f"--mem={memory_mb(res.memory)}M",
        f"--output={attempt_dir / 'job.log'}",
        f"--chdir={os.getcwd()}",
        "--export=ALL",
        "--no-requeue",  # trainflow retries from its own checkpoint, with its own budgets
    ]
    if res.gpu:
        command.append(f"--gpus-per-node={res.gpu}")
    for flag, value in (
        ("partition", slurm.partition),
        ("account", slurm.account),
        ("qos", slurm.qos),
        ("time", slurm.time_limit),
        ("constraint", slurm.constraint),
        ("gres", slurm.gres),
    ):
        if value:
            command.append(f"--{flag}={value}")
    if slurm.warn_before_limit_s:
        command.append(f"--signal=TERM@{slurm.warn_before_limit_s}")
    if slurm.exclusive:
        command.append("--exclusive")
    if exclude:
        command.append(f"--exclude={','.join(exclude)}")
    command += slurm.sbatch_args
    return [*command, str(attempt_dir / "job.sh")]


def batch_script(spec: RunSpec, run_id: str, attempt: int, attempt_dir: Path) -> str:
    python = shlex.quote(sys.executable)
    folder = shlex.quote(str(attempt_dir))
    pick_port = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    return f"""#!/bin/bash
# trainflow run {run_id}, attempt {attempt}: one torchrun agent per node
set -eu
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
address=$(getent ahostsv4 "$first" | awk 'NR == 1 {{print $1}}')
# this script runs on the first node: the rendezvous port is free here, and this job's alone
port=$({python} -c {shlex.quote(pick_port)})
export {RDZV_ENV}="${{address:-$first}}:$port"
echo "rendezvous at ${RDZV_ENV}"
exec srun --nodes={spec.resources.nodes} --ntasks-per-node=1 --cpus-per-task={math.ceil(spec.resources.cpu)} \\
  --kill-on-bad-exit=0 --output={folder}/node-%n.log \\
  {python} -m trainflow.backends.slurm.node_agent {folder}
"""
