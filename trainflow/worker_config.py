"""What the orchestrator tells every worker of an attempt, as one JSON file named by an env var.

Kept free of heavy imports: the runtime inside each worker reads it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

CONFIG_ENV = "TRAINFLOW_WORKER_CONFIG"
JOB_ENV = "TRAINFLOW_JOB"  # marks every process of a job, so teardown can find survivors


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
    divergence_check_every_steps: int = 0
    restore_prefix: str | None = None
    snapshot_every_s: float = 0.0  # checkpoint.snapshot_every_s: 0 snapshots every checkpoint
    keep_every_steps: int = 0  # checkpoint.keep_every_steps: these steps are always snapshotted
    local_tier: bool = True  # checkpoint.local_tier: save to node-local disk first, restore from it
    parallel_strategy: str = "ddp"  # parallel.strategy; the data degree follows from the world size
    tensor_degree: int = 1  # parallel.tensor
    pipeline_degree: int = 1  # parallel.pipeline

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def from_env(cls) -> WorkerConfig:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            raise RuntimeError(
                f"{CONFIG_ENV} is not set: run this script through `trainflow run SPEC`, not directly"
            )
        return cls(**json.loads(Path(path).read_text()))
