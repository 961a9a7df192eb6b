"""What the orchestrator tells every worker of an attempt, as one JSON file named by an env var.

Kept free of heavy imports: the runtime inside each worker reads it.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainflow.private_files import private_folder, write_private

CONFIG_ENV = "TRAINFLOW_WORKER_CONFIG"
JOB_ENV = "TRAINFLOW_JOB"  # marks every process of a job, so teardown can find survivors
RELAY_ENV = "TRAINFLOW_STATUS_RELAY"  # where a node's ranks report: its relay, set by the node's agent


@dataclass(frozen=True)
class WorkerConfig:
    run_id: str
    attempt: int
    node: int
    status_address: str
    status_token: str
    checkpoint_uri: str
    every_steps: int
    total_steps: int
    seed: int
    spec_hash: str
    code_version: str
    comm_backend: str
    collective_timeout_s: float
    heartbeat_interval_s: float
    orchestrator_timeout_s: float
    node_scratch: str
    # a folder only this node's processes reach, whatever its mode (a pod's emptyDir): node_scratch
    # is made in it by the node's agent (private_files.py)
    scratch_volume: str | None = None
    divergence_check_every_steps: int = 0
    restore_prefix: str | None = None
    snapshot_every_s: float = 0.0  # checkpoint.snapshot_every_s: 0 snapshots every checkpoint
    keep_every_steps: int = 0  # checkpoint.keep_every_steps: these steps are always snapshotted
    local_tier: bool = True  # checkpoint.local_tier: save to node-local disk first, restore from it
    buddy_copies: bool = True  # checkpoint.buddy_copies: each node's local files also on the next node
    # drills: wait after each of these steps until its gate (`step_gate(fault_gate, step)`) exists
    pause_at_steps: tuple[int, ...] = ()
    fault_gate: str | None = None
    parallel_strategy: str = "ddp"  # parallel.strategy; the data degree follows from the world size
    tensor_degree: int = 1  # parallel.tensor
    pipeline_degree: int = 1  # parallel.pipeline
    world_size: int = 0  # the attempt's
    plain_checkpoint_dir: str | None = None  # workload.plain.checkpoint_dir: the agents copy and restore it
    plain_resume_args: tuple[str, ...] = ()  # workload.plain.resume_args: appended when a copy was restored
    # fault_tolerance.in_process_restart: how many recoveries in place each outcome an exception or a
    # rank's death can have (INFRA, USER_ERROR, CRASHED, KILLED, HUNG) has left in its budget; empty:
    # none (runtime/in_place.py, backends/rank_replacement.py)
    in_place_budget: dict[str, int] = field(default_factory=dict)
    memory_every_steps: int | None = None  # checkpoint.memory_every_steps; None: as often as costs <= 2%

    def write(self, path: Path) -> Path:
        """A new file readable by its owner only: it holds the status channel's token."""
        private_folder(path.parent)
        return write_private(path, json.dumps(asdict(self), indent=1))

    def make_node_scratch(self) -> Path:
        """The node's private scratch folder, made where the launcher could not make it (only the
        node can: Slurm, Kubernetes)."""
        return private_folder(Path(self.node_scratch), Path(self.scratch_volume) if self.scratch_volume else None)

    @classmethod
    def from_env(cls) -> WorkerConfig:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            raise RuntimeError(f"{CONFIG_ENV} is not set: run this script through `trainflow run SPEC`, not directly")
        return cls(**json.loads(Path(path).read_text()))


EXCEPTION_SIGNAL = signal.SIGUSR2  # a drill's exception fault: the rank raises where it is (runtime/fault_gate.py)

# in-process restart (runtime/in_place.py): the node's shared-memory folder of its ranks' in-memory
# copies (backends/shared_copies.py), and, in a rank process started in place of one that died
# (backends/rank_replacement.py), what became of that one (JSON)
MEMORY_COPIES_ENV = "TRAINFLOW_MEMORY_COPIES"
REPLACES_ENV = "TRAINFLOW_REPLACES"
GAVE_UP = "gave-up"  # a replacement's mark in its rank's copies folder: its round was no go


def rank_copies_folder(rank: int) -> Path | None:
    """In a rank: its own folder in its node's shared-memory folder, made if missing; None without one."""
    node = os.environ.get(MEMORY_COPIES_ENV)
    if not node or not os.path.isdir(node):
        return None
    folder = Path(node) / f"rank-{rank}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def fault_gate_path(scratch: Path, attempt: int) -> Path:
    """Where an attempt's fault gates are named from (`step_gate`)."""
    return scratch / f"fault-gate-{attempt}"


def step_gate(gate: Path, step: int) -> Path:
    """The file a drill creates once its fault at `step` is in, releasing the ranks waiting there."""
    return gate.with_name(f"{gate.name}-step-{step}")


def gate_arrival_path(gate: Path, rank: int) -> Path:
    """The file a rank creates once it stands at the fault gate: its step's checkpoint call has
    returned, so the save before that one is finished (a save begins only after the one before)."""
    return gate.with_name(f"{gate.name}.rank-{rank}")


def gate_signal_path(gate: Path, rank: int) -> Path:
    """The file a rank standing at the fault gate creates once a SIGTERM reached it: a preemption
    delivered through a scheduler takes its own time, and the gate holds the ranks until it lands."""
    return gate.with_name(f"{gate.name}.rank-{rank}.sigterm")
