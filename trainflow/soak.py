"""A soak: one longer job with many faults of every kind at random steps, and how each was read.

Fault i goes into attempt i + 1, at a random step of its own slice of the job, so every attempt
resumes before the next fault's step. The report is a confusion matrix (injected kind x detected
outcome), the steps each fault lost, whether the final parameters equal a fault-free baseline's,
what was left behind, and every failed attempt no fault explains.
"""

from __future__ import annotations

import random
from collections import Counter

from trainflow.chaos import FaultKind, FaultPlan
from trainflow.drill import EXPECTED_OUTCOME, lost_steps_limit
from trainflow.spec import RunSpec, SpecError


def soak_spec(spec: RunSpec, faults: int) -> RunSpec:
    """The job with budgets for every fault it will get: each is retried, none ends the run."""
    raw = spec.model_dump(mode="json")
    tolerance = raw["fault_tolerance"]
    tolerance["max_restarts"] = max(tolerance["max_restarts"], faults)
    tolerance["max_preemptions"] = max(tolerance["max_preemptions"], faults)
    return RunSpec.model_validate(raw)

# the kinds a soak on the local backend injects without root or an S3 store; each ends its attempt
SOAK_KINDS = (FaultKind.crash, FaultKind.kill, FaultKind.hang, FaultKind.preempt)


def plan_faults(spec: RunSpec, faults: int, seed: int) -> list[FaultPlan]:
    """`faults` faults cycling through the kinds (in a seeded order), each at a random step of its slice."""
    every = spec.checkpoint.every_steps
    slice_steps = spec.workload.steps // (faults + 1)
    if faults < 1:
        raise SpecError("--faults: at least 1")
    if slice_steps < 2 * every:
        raise SpecError(f"workload.steps: {spec.workload.steps} steps leave {slice_steps} per fault; a soak of "
                        f"{faults} faults needs at least {2 * every} (2 x checkpoint.every_steps) per fault")
    rng = random.Random(seed)
    kinds = list(SOAK_KINDS)
    rng.shuffle(kinds)
    plans = []
    for index in range(faults):
        low = (index + 1) * slice_steps + every  # past the checkpoint the previous attempt resumes from
        step = rng.randint(low, (index + 2) * slice_steps - 1)
        rank = rng.randrange(spec.world_size)
        plans.append(FaultPlan(kind=kinds[index % len(kinds)], attempt=index + 1, at_step=step, rank=rank))
    return plans


def soak_report(plans: list[FaultPlan], summary: dict, baseline: dict, leftovers: list[str],
                every_steps: int) -> dict:
    """The soak's figures from the faulted run's summary and the baseline."""
    attempts = summary.get("attempts", [])
    injections = summary.get("faults", [])
    matrix: Counter = Counter()
    per_fault = []
    for index, plan in enumerate(plans):
        injection = injections[index] if index < len(injections) else {}
        row = attempts[index] if index < len(attempts) else None
        detected = row["outcome"] if row else None
        matrix[(plan.kind.value, detected)] += 1
        per_fault.append({
            "kind": plan.kind.value, "attempt": plan.attempt, "at_step": plan.at_step,
            "injected": bool(injection.get("injected")),
            "injected_at_step": (injection.get("detail") or {}).get("step"),
            "detected": detected, "expected": EXPECTED_OUTCOME[plan.kind],
            "lost_steps": row["lost_steps"] if row else None,
        })
    failed_attempts = [a for a in attempts if a["outcome"] != "SUCCEEDED"]
    unexplained = [a for a in failed_attempts if a["attempt"] > len(plans)]
    total = summary.get("total_steps")
    # an attempt that trained to the last step and still counts as failed (a lingering agent, once)
    successes_as_failures = [a for a in failed_attempts if total is not None and a["last_step"] >= total]
    report = {
        "faults": len(plans),
        "status": summary.get("status"),
        "reason": summary.get("reason"),
        "confusion": [{"injected": kind, "detected": detected, "count": count}
                      for (kind, detected), count in sorted(matrix.items(), key=lambda item: str(item[0]))],
        "per_fault": per_fault,
        "misclassified": [f for f in per_fault if f["detected"] != f["expected"]],
        "late_injections": [f for f in per_fault if f["injected_at_step"] is None
                            or abs(f["injected_at_step"] - f["at_step"]) > 1],
        "over_lost": [f for f in per_fault if f["lost_steps"] is not None and f["lost_steps"] > (
            0 if f["kind"] == "preempt" else lost_steps_limit(f["injected_at_step"] or f["at_step"], every_steps))],
        "unexplained_attempts": unexplained,
        "successes_recorded_as_failures": successes_as_failures,
        "params_match_baseline": summary.get("params_sha256") is not None
        and summary.get("params_sha256") == baseline.get("params_sha256"),
        "leftovers": leftovers,
        "mlflow_run_id": summary.get("mlflow_run_id"),
        "goodput": summary.get("goodput"),
    }
    report["passed"] = (
        report["status"] == "succeeded" and not report["misclassified"] and not report["late_injections"]
        and not report["over_lost"] and not unexplained and not successes_as_failures
        and report["params_match_baseline"] and not leftovers
    )
    return report


def render_confusion(report: dict) -> str:
    """The confusion matrix as text: one row per injected kind, one column per detected outcome."""
    kinds = sorted({c["injected"] for c in report["confusion"]})
    detected = sorted({str(c["detected"]) for c in report["confusion"]})
    cells = {(c["injected"], str(c["detected"])): c["count"] for c in report["confusion"]}
    width = max([len(d) for d in detected] + [9])
    lines = ["injected \\ detected".ljust(20) + "".join(d.rjust(width + 1) for d in detected)]
    for kind in kinds:
        lines.append(kind.ljust(20) + "".join(str(cells.get((kind, d), 0)).rjust(width + 1) for d in detected))
    return "\n".join(lines)
