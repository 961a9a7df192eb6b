"""How the local backend starts one node's torchrun agent: its command line and environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trainflow.backends.base import AttemptPlan
from trainflow.backends.bounded_output import LOG_LIMIT_ENV, RANK_STDERR_ENV, torchrun_log_dir
from trainflow.backends.local.allocation import LocalAllocation
from trainflow.backends.quick_rendezvous import POLL_ENV, poll_interval_s
from trainflow.backends.worker import secret_environment
from trainflow.worker_config import CONFIG_ENV, JOB_ENV

LOOPBACK = "127.0.0.1"


def agent_command(
    spec, allocation: LocalAllocation, plan: AttemptPlan, node: int, slot: int, attempt_dir: Path
) -> list[str]:
    """The agent as a new interpreter, in its node's network."""
    command = [
        sys.executable,
        "-m",
        "trainflow.backends.agent",
        *torchrun_arguments(spec, allocation, plan, node, slot, attempt_dir),
    ]
    network = allocation.network
    return network.wrap(command, slot) if network else command


def torchrun_arguments(
    spec, allocation: LocalAllocation, plan: AttemptPlan, node: int, slot: int, attempt_dir: Path
) -> list[str]:
    network = allocation.network
    store_host = network.node_address(allocation.slots[0]) if network else LOOPBACK
    own_address = network.node_address(slot) if network else LOOPBACK
    return [
        "--nnodes",
        str(spec.resources.nodes),
        "--nproc-per-node",
        str(spec.resources.procs_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{store_host}:{allocation.ports['rendezvous']}",
        "--rdzv-id",
        f"{allocation.run_id}-{plan.attempt}",
        "--rdzv-conf",
        f"is_host={'true' if node == 0 else 'false'}",
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        "--local-addr",
        own_address,
        # each rank's error file; its output goes through the agent's bounded node log (bounded_output.py)
        "--log-dir",
        str(torchrun_log_dir(attempt_dir, node)),
        spec.workload.entrypoint,
        *spec.workload.args,
    ]


def output_environment(spec, attempt_dir: Path, node: int) -> dict[str, str]:
    """What bounds a node's log and keeps each rank's last stderr lines (bounded_output.py)."""
    return {
        LOG_LIMIT_ENV: str(int(spec.tracking.max_node_log_mb * 2**20)),
        RANK_STDERR_ENV: str(torchrun_log_dir(attempt_dir, node)),
    }


def agent_environment(spec, allocation: LocalAllocation, node: int, config_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(secret_environment(spec))  # explicitly, whatever else of this environment is passed on
    env.update(
        {
            CONFIG_ENV: str(config_path),
            JOB_ENV: allocation.run_id,
            "PYTHONUNBUFFERED": "1",
            POLL_ENV: str(poll_interval_s(spec.resources.nodes)),
            "OMP_NUM_THREADS": str(max(1, int(spec.resources.cpu // spec.resources.procs_per_node))),
        }
    )
    # the communication library's own account of each attempt lands in the node logs
    env.setdefault("TORCH_CPP_LOG_LEVEL", "INFO")
    if spec.comm_backend() == "nccl":
        env.setdefault("NCCL_DEBUG", "INFO")
    if allocation.network is not None:
        env["GLOO_SOCKET_IFNAME"] = "eth0"
    if spec.resources.gpu:
        first = node * spec.resources.gpu
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(spec.resources.gpu))
    return env
