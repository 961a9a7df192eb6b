"""A soak: one longer job with many faults of every kind at random steps, and how each was read.

Fault i goes at a random step of its own slice of the job, so every attempt resumes before the next
fault's step. A fault that ends its attempt moves the next fault into the next attempt; with
fault_tolerance.in_process_restart, a crash, a kill, a hang or an exception is recovered within its
attempt (a round in place), and the next fault goes into the same attempt. A lost node comes back
for the next attempt (as a replaced node would), so the world size, and with it the exactness of
every later resume, is kept; a storage outage is an endpoint that stops answering for longer than
the hang timeout; a damaged checkpoint is passed over at the restore after a SIGKILL.
The report is a confusion matrix (injected kind x detected outcome), the steps each fault lost,
whether the final parameters equal a fault-free baseline's, what was left behind, and every
failed attempt no fault explains.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from collections import Counter

from trainflow.backends import launcher_for
from trainflow.drills.chaos import FaultKind, FaultPlan, backend_inability
from trainflow.drills.drill import EXPECTED_OUTCOME, RECOVERED_IN_PLACE, lost_steps_limit
from trainflow.orchestrator.watcher import HANG_FLOOR_S
from trainflow.runspec import RunSpec, SpecError

# every kind that ends an attempt, so one attempt per fault; a storage outage ends it as INFRA
SOAK_KINDS = (
    FaultKind.crash,
    FaultKind.kill,
    FaultKind.hang,
    FaultKind.preempt,
    FaultKind.node_loss,
    FaultKind.storage_outage,
    FaultKind.corrupt_checkpoint,
)
SOAK_EXPECTED = {**EXPECTED_OUTCOME, FaultKind.storage_outage: "INFRA"}
NEVER_SOAKED = {
    FaultKind.straggler: "training goes on under it, no attempt ends; `trainflow drill --fault straggler` scores it",
}
IN_PLACE_ONLY = {
    FaultKind.exception: "soaked with fault_tolerance.in_process_restart, which recovers it within its attempt; "
    "without it `trainflow drill --fault exception` scores it",
}
OUTAGE_PAST_HANG_S = 15.0  # a storage outage outlasts the hang timeout by this much: it must end the attempt


def can_make_hosts() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def soak_kinds(spec: RunSpec, wanted: list[FaultKind] | None = None) -> tuple[list[FaultKind], dict[str, str]]:
    """The kinds this soak injects, and why each other kind is not: asked-for kinds that cannot run
    here are refused, naming the option."""
    missing = {}
    if not spec.checkpoint.is_remote or not (
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    ):
        missing[FaultKind.storage_outage] = "needs an s3:// checkpoint.uri and AWS_ENDPOINT_URL_S3"
    if not can_make_hosts():
        missing[FaultKind.node_loss] = "needs root and iproute2 (a network namespace per node)"
    elif FaultKind.storage_outage not in missing:
        # the drills' S3 endpoint and its relay listen on this host's loopback, which a node in its
        # own network namespace cannot reach: node loss is soaked with a checkpoint.uri on local disk
        missing[FaultKind.node_loss] = (
            "with an s3:// checkpoint.uri: nodes in network namespaces cannot reach "
            "the S3 endpoint on this host's loopback; soak it with a local checkpoint.uri"
        )
    if not spec.fault_tolerance.in_process_restart:
        missing.update(IN_PLACE_ONLY)
    launcher = launcher_for(spec)
    for kind in (*SOAK_KINDS, *IN_PLACE_ONLY):  # what the backend cannot inject outranks every other reason
        if inability := backend_inability(kind, launcher):
            missing[kind] = inability
    if wanted:
        for kind in wanted:
            if kind in NEVER_SOAKED or kind in missing:
                raise SpecError(f"--kinds {kind.value}: {(NEVER_SOAKED | missing)[kind]}")
        return list(dict.fromkeys(wanted)), {}
    kinds = [k for k in (*SOAK_KINDS, *IN_PLACE_ONLY) if k not in missing]
    return kinds, {k.value: reason for k, reason in (NEVER_SOAKED | missing).items()}


def soak_spec(spec: RunSpec, faults: int, kinds: list[FaultKind] | None = None) -> RunSpec:
    """The job with budgets for every fault it will get (each is retried at once, none ends the run),
    and what its kinds need: a network namespace per node for node loss, every save on S3 at once for
    a storage outage to block on."""
    raw = spec.model_dump(mode="json")
    tolerance = raw["fault_tolerance"]
    tolerance["max_restarts"] = max(tolerance["max_restarts"], faults)
    tolerance["max_preemptions"] = max(tolerance["max_preemptions"], faults)
    tolerance["max_infra_failures"] = max(tolerance["max_infra_failures"], faults)
    tolerance["backoff_s"] = 0  # the faults are planned, not a failing machine: no retry waits for them
    if FaultKind.storage_outage in (kinds or []):
        raw["checkpoint"]["snapshot_every_s"] = 0
    soaked = RunSpec.model_validate(raw)
    if FaultKind.node_loss in (kinds or []):
        return soaked.model_copy(update={"backend_config": soaked.backend_config.for_node_loss()})
    return soaked


def plan_faults(spec: RunSpec, faults: int, seed: int, kinds: list[FaultKind] | None = None) -> list[FaultPlan]:
    """`faults` faults cycling through the kinds (in a seeded order), each at a random step of its slice."""
    every = spec.checkpoint.every_steps
    slice_steps = spec.workload.steps // (faults + 1)
    if faults < 1:
        raise SpecError("--faults: at least 1")
    if slice_steps < 2 * every:
        raise SpecError(
            f"workload.steps: {spec.workload.steps} steps leave {slice_steps} per fault; a soak of "
            f"{faults} faults needs at least {2 * every} (2 x checkpoint.every_steps) per fault"
        )
    rng = random.Random(seed)
    kinds = list(kinds or [k for k in SOAK_KINDS if k not in (FaultKind.node_loss, FaultKind.storage_outage)])
    rng.shuffle(kinds)
    outage_s = (spec.fault_tolerance.hang_timeout_s or HANG_FLOOR_S) + OUTAGE_PAST_HANG_S
    plans, attempt = [], 1
    for index in range(faults):
        low = (index + 1) * slice_steps + every  # past the checkpoint the previous attempt resumes from
        step = rng.randint(low, (index + 2) * slice_steps - 1)
        rank = rng.randrange(spec.world_size)
        node = rng.randrange(spec.resources.nodes)
        kind = kinds[index % len(kinds)]
        plans.append(
            FaultPlan(kind=kind, attempt=attempt, at_step=step, rank=rank, node=node, duration_s=outage_s, stall=True)
        )
        if not in_place(spec, kind):
            attempt += 1
    return plans


def in_place(spec: RunSpec, kind: FaultKind) -> bool:
    """Whether a fault of `kind` is recovered within its attempt in this spec's job."""
    return spec.fault_tolerance.in_process_restart and kind in RECOVERED_IN_PLACE


def damaged_step(injection: dict) -> int | None:
    """The step of the checkpoint a corrupt-checkpoint fault damaged, from the key it names."""
    found = re.search(r"step-(\d+)", str((injection.get("detail") or {}).get("damaged", "")))
    return int(found.group(1)) if found else None


def soak_report(plans: list[FaultPlan], summary: dict, baseline: dict, leftovers: list[str], every_steps: int) -> dict:
    """The soak's figures from the faulted run's summary and the baseline. A fault of a kind
    recovered in place is read from the next round in place of its attempt, where there is one;
    any other, or one whose attempt had no round left for it, from its attempt's end."""
    attempts = summary.get("attempts", [])
    injections = summary.get("faults", [])
    by_attempt = {a["attempt"]: a for a in attempts}
    rounds_left = {a["attempt"]: list(a.get("in_place") or []) for a in attempts}
    matrix: Counter = Counter()
    per_fault = []
    for index, plan in enumerate(plans):
        injection = injections[index] if index < len(injections) else {}
        row = by_attempt.get(plan.attempt)
        rounds = rounds_left.get(plan.attempt) or []
        round_ = rounds.pop(0) if plan.kind in RECOVERED_IN_PLACE and rounds else None
        if round_ is not None:
            detected, lost, resumed = round_["outcome"], round_["lost_steps"], round_["restored_step"]
        else:
            retry = by_attempt.get(plan.attempt + 1)
            detected = row["outcome"] if row else None
            # an attempt's lost steps count its rounds in place too: the restart's are the rest
            in_place_lost = sum(r["lost_steps"] for r in (row.get("in_place") or [])) if row else 0
            lost = row["lost_steps"] - in_place_lost if row else None
            resumed = retry["resumed_from_step"] if retry else None
        matrix[(plan.kind.value, detected)] += 1
        fault = {
            "kind": plan.kind.value,
            "attempt": plan.attempt,
            "at_step": plan.at_step,
            "injected": bool(injection.get("injected")),
            "target": injection.get("target"),
            "injected_at_step": (injection.get("detail") or {}).get("step"),
            "detected": detected,
            "expected": SOAK_EXPECTED[plan.kind],
            "in_place": round_ is not None,
            "lost_steps": lost,
            "resumed_from_step": resumed,
        }
        if plan.kind == FaultKind.corrupt_checkpoint:
            # found at the restore: the retry resumes from any checkpoint but the damaged one (a newer
            # one may have been committed between the damage and the kill)
            fault["damaged_step"] = damaged_step(injection)
            fault["rejected_at_restore"] = (
                fault["damaged_step"] is not None
                and fault["resumed_from_step"] is not None
                and fault["resumed_from_step"] != fault["damaged_step"]
            )
        per_fault.append(fault)
    failed_attempts = [a for a in attempts if a["outcome"] != "SUCCEEDED"]
    # every failed attempt is a fault's that ended it, and every round in place a fault's
    ended_by_faults = {f["attempt"] for f in per_fault if not f["in_place"]}
    unexplained = [a for a in failed_attempts if a["attempt"] not in ended_by_faults] + [
        {"attempt": number, **round_} for number, rounds in sorted(rounds_left.items()) for round_ in rounds
    ]
    total = summary.get("total_steps")
    # an attempt that trained to the last step and still counts as failed (a lingering agent, once)
    successes_as_failures = [a for a in failed_attempts if total is not None and a["last_step"] >= total]
    report = {
        "faults": len(plans),
        "status": summary.get("status"),
        "reason": summary.get("reason"),
        "confusion": [
            {"injected": kind, "detected": detected, "count": count}
            for (kind, detected), count in sorted(matrix.items(), key=lambda item: str(item[0]))
        ],
        "per_fault": per_fault,
        "misclassified": [f for f in per_fault if f["detected"] != f["expected"]],
        "late_injections": [
            f for f in per_fault if f["injected_at_step"] is None or abs(f["injected_at_step"] - f["at_step"]) > 1
        ],
        # a damaged checkpoint costs the interval before it too: not held to one interval
        "over_lost": [
            f
            for f in per_fault
            if f["lost_steps"] is not None
            and f["kind"] != "corrupt-checkpoint"
            and f["lost_steps"]
            > (0 if f["kind"] == "preempt" else lost_steps_limit(f["injected_at_step"] or f["at_step"], every_steps))
        ],
        "damaged_checkpoints_loaded": [f for f in per_fault if f.get("rejected_at_restore") is False],
        "unexplained_attempts": unexplained,
        "successes_recorded_as_failures": successes_as_failures,
        "params_match_baseline": summary.get("params_sha256") is not None
        and summary.get("params_sha256") == baseline.get("params_sha256"),
        "leftovers": leftovers,
        "mlflow_run_id": summary.get("mlflow_run_id"),
        "goodput": summary.get("goodput"),
    }
    report["passed"] = (
        report["status"] == "succeeded"
        and not report["misclassified"]
        and not report["late_injections"]
        and not report["over_lost"]
        and not report["damaged_checkpoints_loaded"]
        and not unexplained
        and not successes_as_failures
        and report["params_match_baseline"]
        and not leftovers
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
