"""Fault drills: the same job with and without one injected fault, and what the difference cost.

A drill needs a fault-free baseline of the same job (same seed and world size) to prove the
resume was exact; baselines are kept per job and environment under TRAINFLOW_HOME/baselines.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trainflow.chaos import FaultKind, FaultPlan
from trainflow.home import trainflow_home
from trainflow.spec import LocalNetwork, RunSpec, SpecError

# Faults after which the run must end bit-identical to the baseline.
EXACT_AFTER = {FaultKind.crash, FaultKind.kill, FaultKind.hang, FaultKind.preempt, FaultKind.node_loss,
               FaultKind.corrupt_checkpoint, FaultKind.straggler, FaultKind.storage_outage}


def drill_spec(spec: RunSpec, plan: FaultPlan) -> RunSpec:
    """The spec a drill runs: node-loss needs one network namespace per node."""
    if plan.kind == FaultKind.node_loss and spec.resources.network != LocalNetwork.namespaces:
        raw = spec.model_dump(mode="json")
        raw["resources"]["network"] = LocalNetwork.namespaces.value
        return RunSpec.model_validate(raw)
    return spec


def check_plan(spec: RunSpec, plan: FaultPlan) -> None:
    """Refuse drills that cannot work on this spec, naming the option."""
    if plan.at_step >= spec.workload.steps:
        raise SpecError(f"--at-step {plan.at_step}: must be before the last step ({spec.workload.steps})")
    if plan.rank is not None and plan.rank >= spec.world_size:
        raise SpecError(f"--rank {plan.rank}: the world size is {spec.world_size}")
    if plan.node is not None and plan.node >= spec.resources.nodes:
        raise SpecError(f"--node {plan.node}: the job has {spec.resources.nodes} node(s)")
    if plan.kind == FaultKind.storage_outage and not spec.checkpoint.is_s3:
        raise SpecError("--fault storage-outage: needs an s3:// checkpoint.uri")
    if plan.kind in (FaultKind.node_loss, FaultKind.preempt) and spec.resources.backend.value not in ("local", "slurm"):
        raise SpecError(f"--fault {plan.kind.value}: drills run on the local and slurm backends")


def baseline_key(spec: RunSpec, environment_fingerprint: str) -> str:
    """What decides the final parameters: workload, seed, shape and parallelism, code and packages."""
    identity = {
        "workload": spec.workload.model_dump(mode="json"),
        "seed": spec.seed,
        "nodes": spec.resources.nodes,
        "procs_per_node": spec.resources.procs_per_node,
        "gpu": spec.resources.gpu,
        "parallel": spec.parallel.model_dump(mode="json"),
        "environment": environment_fingerprint,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def baseline_path(key: str) -> Path:
    return trainflow_home() / "baselines" / f"{key}.json"


def load_baseline(key: str) -> dict | None:
    path = baseline_path(key)
    return json.loads(path.read_text()) if path.exists() else None


def save_baseline(key: str, summary: dict) -> dict:
    baseline = {k: summary.get(k) for k in ("params_sha256", "final_step", "mlflow_run_id", "run_id", "goodput")}
    path = baseline_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(baseline, indent=1))
    return baseline


def drill_report(plan: FaultPlan, summary: dict, baseline: dict, torchrun_restart_s: float | None,
                 released: bool) -> dict:
    """The drill's figures, from the faulted run's summary and the baseline."""
    attempts = summary.get("attempts", [])
    fault = (summary.get("faults") or [{}])[0]
    injected_at = fault.get("injected_at")
    failed = attempts[0] if attempts and attempts[0]["outcome"] != "SUCCEEDED" else None
    retry = attempts[1] if len(attempts) > 1 else None
    detected_kind, latency, detected_at_step = None, None, None
    if failed is not None:
        detected_kind = failed["outcome"]
        detected_at_step = failed.get("last_step")
        detected_at = failed["ended_at"] if failed.get("detected_at") is None else failed["detected_at"]
        latency = None if injected_at is None else round(detected_at - injected_at, 3)
    elif summary.get("stragglers"):
        first = summary["stragglers"][0]
        detected_kind = "STRAGGLER"
        detected_at_step = first["step"]
        latency = None if injected_at is None else round(first["t"] - injected_at, 3)
    recovery = retry["recovery_s"] if retry else None
    report = {
        "fault": plan.kind.value,
        "injected": bool(fault.get("injected")),
        "target": fault.get("target"),
        "at_step": plan.at_step,
        "injected_at_step": (fault.get("detail") or {}).get("step"),
        "detected_kind": detected_kind,
        "detection_latency_s": latency,
        "detected_at_step": detected_at_step,
        "recovery_s": recovery,
        "torchrun_restart_s": None if torchrun_restart_s is None else round(torchrun_restart_s, 3),
        "recovery_vs_torchrun": (
            round(recovery / torchrun_restart_s, 2) if recovery is not None and torchrun_restart_s else None
        ),
        "lost_steps": failed["lost_steps"] if failed else 0,
        "resumed_from_step": retry["resumed_from_step"] if retry else None,
        "attempts": len(attempts),
        "outcomes": [a["outcome"] for a in attempts],
        "status": summary.get("status"),
        "final_step": summary.get("final_step"),
        "params_sha256": summary.get("params_sha256"),
        "baseline_params_sha256": baseline.get("params_sha256"),
        "params_match_baseline": summary.get("params_sha256") is not None
        and summary.get("params_sha256") == baseline.get("params_sha256"),
        "resources_released": released,
        "goodput": summary.get("goodput"),
        "mlflow_run_id": summary.get("mlflow_run_id"),
        "baseline_mlflow_run_id": baseline.get("mlflow_run_id"),
        "prefect_flow_run_id": summary.get("prefect_flow_run_id"),
    }
    report["passed"] = drill_passed(plan, report)
    return report


def drill_passed(plan: FaultPlan, report: dict) -> bool:
    """The targets a drill must meet to count as passed."""
    if report["status"] != "succeeded" or not report["resources_released"] or not report["injected"]:
        return False
    if plan.kind == FaultKind.preempt and report["lost_steps"] != 0:
        return False
    if plan.kind == FaultKind.node_loss and plan.permanent:
        return True  # a smaller world trains differently; finishing is what counts
    return report["params_match_baseline"] or plan.kind not in EXACT_AFTER
