"""A silent node and a hung attempt's stacks, asked on the node itself through a step inside the
running job (`srun --overlap`): the orchestrator cannot see a compute node's processes."""

from __future__ import annotations

import json
import subprocess
import sys

from trainflow.backends.slurm import commands
from trainflow.backends.slurm.allocation import SlurmAttempt

PROBE_TIMEOUT_S = 6.0
STACKS_TIMEOUT_S = 60.0


def probe_node(handle: SlurmAttempt, node: int) -> str:
    """A silent node as Slurm and the node itself see it: its state at the controller, and the
    job's processes there (no answer: unreachable)."""
    if node >= len(handle.node_names):
        return "unknown"
    name = handle.node_names[node]
    slurm_state = commands.node_state(name)
    evidence = f"slurm node {name}: {slurm_state.get('State', '?')}"
    if slurm_state.get("Reason"):
        evidence += f" ({slurm_state['Reason']})"
    answer = ask_node(handle, name, "state", PROBE_TIMEOUT_S)
    if answer in ("workers-stopped", "running", "gone"):
        return answer
    return f"unreachable; {evidence}"


def node_stacks(handle: SlurmAttempt, pids_by_rank: dict[int, int]) -> dict[int, str]:
    """Every rank's Python stacks, read with py-spy on each node."""
    stacks: dict[int, str] = {}
    for name in handle.node_names:
        answer = ask_node(handle, name, "stacks", STACKS_TIMEOUT_S)
        try:
            stacks.update({int(rank): text for rank, text in json.loads(answer or "{}").items()})
        except ValueError:
            continue
    return {rank: stacks.get(rank, "no stack: the node did not answer") for rank in sorted(pids_by_rank)}


def ask_node(handle: SlurmAttempt, name: str, what: str, timeout_s: float) -> str | None:
    """node_probe's answer on node `name`; None when the node did not answer in time."""
    command = [
        "srun",
        f"--jobid={handle.job_id}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={name}",
        "--quiet",
        sys.executable,
        "-m",
        "trainflow.backends.slurm.node_probe",
        what,
        handle.run_id,
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    return result.stdout.strip() if result.returncode == 0 else None
