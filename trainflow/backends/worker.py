"""The worker configuration every backend hands to its workers, and the secrets it must not hold."""

from __future__ import annotations

import os
from pathlib import Path

from trainflow.backends.base import AttemptPlan
from trainflow.home import resolve_checkpoint_uri
from trainflow.runspec import RunSpec
from trainflow.worker_config import WorkerConfig, fault_gate_path


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
        buddy_copies=spec.checkpoint.buddy_copies and spec.checkpoint.local_tier,
        pause_at_steps=plan.pause_at_steps,
        # node scratch folders sit side by side in the run's scratch, where the drill opens the gates
        fault_gate=str(fault_gate_path(node_scratch.parent, plan.attempt)) if plan.pause_at_steps else None,
        parallel_strategy=spec.parallel.strategy.value,
        tensor_degree=spec.parallel.tensor,
        pipeline_degree=spec.parallel.pipeline,
        world_size=spec.world_size,
        plain_checkpoint_dir=spec.workload.plain.checkpoint_dir if spec.workload.mode.value == "plain" else None,
        plain_resume_args=tuple(spec.workload.plain.resume_args),
        in_place_budget=dict(plan.in_place_budget),
        memory_every_steps=spec.checkpoint.memory_every_steps,
    )


class SecretUnavailable(RuntimeError):
    """A variable named in workload.secret_env is missing from the orchestrator's environment."""


def secret_environment(spec: RunSpec) -> dict[str, str]:
    """The variables of `workload.secret_env` with their values, read at launch from the
    orchestrator's environment; only ever handed to the workers' environment, never recorded."""
    missing = [name for name in spec.workload.secret_env if name not in os.environ]
    if missing:
        raise SecretUnavailable(f"workload.secret_env: {', '.join(missing)} not set in the orchestrator's environment")
    return {name: os.environ[name] for name in spec.workload.secret_env}
