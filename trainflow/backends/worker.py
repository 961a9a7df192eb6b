"""The worker configuration every backend hands to its workers."""

from __future__ import annotations

from pathlib import Path

from trainflow.backends.base import AttemptPlan
from trainflow.home import resolve_checkpoint_uri
from trainflow.spec import RunSpec
from trainflow.worker_config import WorkerConfig


def worker_config(spec: RunSpec, run_id: str, plan: AttemptPlan, node: int, node_scratch: Path) -> WorkerConfig:
    return WorkerConfig(
        run_id=run_id,
        attempt=plan.attempt,
        node=node,
        status_address=plan.status_address,
        status_token=plan.status_token,
        checkpoint_uri=resolve_checkpoint_uri(spec.checkpoint.uri),
        every_steps=spec.checkpoint.every_steps,
        total_steps=spec.workload.steps,
        seed=spec.seed,
        spec_hash=spec.spec_hash(),
        code_version=plan.code_version,
        comm_backend=spec.comm_backend(),
        collective_timeout_s=spec.parallel.collective_timeout_s,
        heartbeat_interval_s=spec.fault_tolerance.heartbeat_interval_s,
        orchestrator_timeout_s=spec.fault_tolerance.orchestrator_timeout_s,
        node_scratch=str(node_scratch),
        divergence_check_every_steps=spec.fault_tolerance.divergence_check_every_steps,
        restore_prefix=plan.restore_prefix,
        snapshot_every_s=spec.checkpoint.snapshot_every_s,
        keep_every_steps=spec.checkpoint.keep_every_steps,
        local_tier=spec.checkpoint.local_tier,
        parallel_strategy=spec.parallel.strategy.value,
        tensor_degree=spec.parallel.tensor,
        pipeline_degree=spec.parallel.pipeline,
    )
