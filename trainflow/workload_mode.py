"""What each workload mode gives: a plain torchrun script reports nothing to the orchestrator, so
everything built on the runtime's reports is off for it, and the run says so."""

from __future__ import annotations

from trainflow.spec import RunSpec, WorkloadMode

# what needs `trainflow.runtime` inside the workers (node loss does not: a node's relay heartbeats
# whatever its ranks run)
RUNTIME_FEATURES = (
    "progress",  # steps, loss and metrics in MLflow; the progress artifact
    "hang_detection",  # no step progress for hang_timeout_s (exits, signals, preemption still count)
    "checkpoints",  # trainflow's checkpoints, restore and exact resume
    "divergence_check",
    "stragglers",
)


def features_off(spec: RunSpec) -> list[str]:
    return list(RUNTIME_FEATURES) if spec.workload.mode == WorkloadMode.plain else []
