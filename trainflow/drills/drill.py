"""Fault drills: the same job with and without one injected fault, and what the difference cost.

A drill needs a fault-free baseline of the same job (same seed and world size) to prove the
resume was exact; baselines are kept per job and environment under TRAINFLOW_HOME/baselines.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trainflow.backends import launcher_for
from trainflow.backends.abilities import KnowsRankProcesses
from trainflow.checkpoint.catalog import step_of
from trainflow.drills.chaos import PLAIN_SIGNALS, FaultKind, FaultPlan, backend_inability
from trainflow.home import trainflow_home
from trainflow.runspec import RunSpec, SpecError, WorkloadMode


def drill_spec(spec: RunSpec, plan: FaultPlan) -> RunSpec:
    """The spec a drill runs: node-loss needs nodes that can each be cut off the network."""
    if plan.kind == FaultKind.node_loss:
        return spec.model_copy(update={"backend_config": spec.backend_config.for_node_loss()})
    return spec


# why a fault cannot go into a plain script, which reports nothing while it runs
NOT_FOR_PLAIN = {
    FaultKind.exception: "a plain script has no trainflow runtime to raise it",
    FaultKind.hang: "a plain script reports no progress, so hang detection is off for it",
    FaultKind.straggler: "a plain script reports no step times, so stragglers are off for it",
    FaultKind.storage_outage: "a plain script's ranks never use the checkpoint store",
}


def is_plain(spec: RunSpec) -> bool:
    return spec.workload.mode == WorkloadMode.plain


def check_plan(spec: RunSpec, plan: FaultPlan) -> None:
    """Refuse drills that cannot work on this spec, naming the option."""
    if is_plain(spec):
        if plan.at_s is None:
            raise SpecError(
                "--at-s: a plain script reports no steps, so its fault goes in at a time: give --at-s "
                "SECONDS after launch"
            )
        if plan.kind in NOT_FOR_PLAIN:
            raise SpecError(f"--fault {plan.kind.value}: {NOT_FOR_PLAIN[plan.kind]}")
        launcher = launcher_for(spec)
        if plan.kind in PLAIN_SIGNALS and not isinstance(launcher, KnowsRankProcesses):
            raise SpecError(
                f"--fault {plan.kind.value}: the {launcher.name} backend cannot name a plain script's "
                "rank processes (it does not implement KnowsRankProcesses)"
            )
        if plan.kind == FaultKind.corrupt_checkpoint and not spec.workload.plain.checkpoint_dir:
            raise SpecError(
                "--fault corrupt-checkpoint: a plain script's checkpoints are copied only with "
                "workload.plain.checkpoint_dir"
            )
    elif plan.at_s is not None:
        raise SpecError(
            "--at-s: only for plain scripts (workload.mode: plain); a runtime script's fault goes in "
            "at a step (--at-step)"
        )
    elif plan.at_step >= spec.workload.steps:
        raise SpecError(f"--at-step {plan.at_step}: must be before the last step ({spec.workload.steps})")
    if plan.rank is not None and plan.rank >= spec.world_size:
        raise SpecError(f"--rank {plan.rank}: the world size is {spec.world_size}")
    if plan.node is not None and plan.node >= spec.resources.nodes:
        raise SpecError(f"--node {plan.node}: the job has {spec.resources.nodes} node(s)")
    if plan.replaced_later and not (plan.kind == FaultKind.node_loss and plan.permanent):
        raise SpecError("--replaced-later: only for --fault node-loss --permanent (the node it replaces)")
    if plan.replaced_later and (spec.resources.min_nodes or spec.resources.nodes) == spec.resources.nodes:
        raise SpecError(
            "--replaced-later: the job shrinks only where resources.min_nodes is below resources.nodes "
            f"({spec.resources.nodes}); set resources.min_nodes"
        )
    if plan.kind == FaultKind.storage_outage and not spec.checkpoint.is_remote:
        raise SpecError("--fault storage-outage: needs an s3:// checkpoint.uri")
    first_checkpoint = spec.checkpoint.every_steps
    if plan.kind == FaultKind.corrupt_checkpoint and plan.at_s is None and plan.at_step <= first_checkpoint:
        # the fault gate guarantees only the save before the fault step's own is committed
        raise SpecError(
            f"--at-step {plan.at_step}: corrupt-checkpoint needs a committed checkpoint before the "
            f"fault, and the first is at step {first_checkpoint} (checkpoint.every_steps); "
            f"use --at-step above {first_checkpoint}"
        )
    inability = backend_inability(plan.kind, launcher_for(spec))
    if inability:
        raise SpecError(f"--fault {plan.kind.value}: {inability}")


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


# What each fault must show up as: the outcome of the attempt it breaks (None: no attempt fails).
EXPECTED_OUTCOME = {
    FaultKind.exception: "INFRA",  # a DistNetworkError
    FaultKind.crash: "CRASHED",
    FaultKind.kill: "KILLED",
    FaultKind.hang: "HUNG",
    FaultKind.preempt: "PREEMPTED",
    FaultKind.node_loss: "NODE_LOST",
    FaultKind.corrupt_checkpoint: "KILLED",  # a rank is killed so the next attempt must restore
    FaultKind.straggler: None,
    FaultKind.storage_outage: None,
}
DETECTED_WITHOUT_FAILURE = {FaultKind.straggler: "STRAGGLER"}
# with fault_tolerance.in_process_restart: the faults recovered within their attempt, and how many
# rank processes are started anew (one in place of the rank that died, or was frozen and ended;
# none for an exception)
RECOVERED_IN_PLACE = {FaultKind.exception: 0, FaultKind.crash: 1, FaultKind.kill: 1, FaultKind.hang: 1}


def drill_report(
    plan: FaultPlan,
    summary: dict,
    baseline: dict,
    torchrun_restart_s: float | None,
    released: bool,
    every_steps: int,
    in_process_restart: bool = False,
) -> dict:
    """The drill's figures, from the faulted run's summary and the baseline, and its verdict. With
    `in_process_restart` an exception is recovered within the attempt: its figures are the
    attempt's recovery in place (contracts/in_place.py)."""
    attempts = summary.get("attempts", [])
    fault = (summary.get("faults") or [{}])[0]
    injected_at = fault.get("injected_at")
    failed = attempts[0] if attempts and attempts[0]["outcome"] != "SUCCEEDED" else None
    retry = attempts[1] if len(attempts) > 1 else None
    in_place = (attempts[0].get("in_place") or [None])[0] if attempts else None
    detected_kind, latency, detected_at_step = None, None, None
    if in_place is not None:
        detected_kind, detected_at_step = in_place["outcome"], in_place["failed_step"]
        latency = None if injected_at is None else round(max(0.0, in_place["failed_at"] - injected_at), 3)
    elif failed is not None:
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
    phases = retry.get("recovery_phases") if retry else None
    lost, resumed = (failed["lost_steps"] if failed else 0), (retry["resumed_from_step"] if retry else None)
    if in_place is not None:
        recovery, phases = in_place["recovery_s"], in_place["phases"]
        lost, resumed = in_place["lost_steps"], in_place["restored_step"]
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
        "recovery_phases": phases,
        "in_place": in_process_restart,
        "ranks_kept": in_place["ranks_kept"] if in_place else None,
        "ranks_replaced": in_place["ranks_replaced"] if in_place else None,
        "memory_copy_every_steps": in_place.get("copy_every_steps", 1) if in_place else None,
        "torchrun_restart_s": None if torchrun_restart_s is None else round(torchrun_restart_s, 3),
        "recovery_vs_torchrun": (
            round(recovery / torchrun_restart_s, 2) if recovery is not None and torchrun_restart_s else None
        ),
        "lost_steps": lost,
        "resumed_from_step": resumed,
        "attempts": len(attempts),
        "outcomes": [a["outcome"] for a in attempts],
        "world_sizes": [a.get("world_size") for a in attempts],
        "resize_lost_steps": sum(a.get("lost_steps") or 0 for a in attempts if a["outcome"] == "RESIZED"),
        # growing back: from the resized attempt's end to the grown attempt's first step
        "resize_recovery_s": next(
            (a.get("recovery_s") for before, a in zip(attempts, attempts[1:]) if before["outcome"] == "RESIZED"), None
        ),
        "reasons": [a.get("reason", "") for a in attempts],
        "status": summary.get("status"),
        "reason": summary.get("reason"),
        "final_step": summary.get("final_step"),
        "params_sha256": summary.get("params_sha256"),
        "baseline_params_sha256": baseline.get("params_sha256"),
        "params_match_baseline": summary.get("params_sha256") is not None
        and summary.get("params_sha256") == baseline.get("params_sha256"),
        "resources_released": released,
        "goodput": summary.get("goodput"),
        "run_id": summary.get("run_id"),
        "mlflow_run_id": summary.get("mlflow_run_id"),
        "baseline_mlflow_run_id": baseline.get("mlflow_run_id"),
        "prefect_flow_run_id": summary.get("prefect_flow_run_id"),
    }
    if plan.at_s is not None:
        return plain_verdict(plan, report, summary, retry, fault)
    report["fault_at_gate"], report["slowest_step_at_fault"] = gate_evidence(fault.get("detail") or {})
    report["newest_checkpoint_before_fault"] = newest_before_fault(plan, report, summary, fault, every_steps)
    report["broken_rules"] = broken_rules(plan, report, every_steps)
    report["passed"] = not report["broken_rules"]
    return report


def plain_verdict(plan: FaultPlan, report: dict, summary: dict, retry: dict | None, fault: dict) -> dict:
    """A drill of a plain script, by what plain mode can prove: the fault went in, was detected as
    its own kind, the retry restored the newest copy committed before it (never a damaged one),
    the run succeeded and released everything. No steps and no parameter hash to compare."""
    detail = fault.get("detail") or {}
    report["at_s"], report["injected_at_s"] = plan.at_s, detail.get("at_s")
    report["params_match_baseline"] = None
    report["resumed_from"] = retry.get("resumed_from") if retry else None
    damaged = str(detail.get("damaged", ""))
    injected_at = fault.get("injected_at") or 0.0
    before = [
        c
        for c in summary.get("checkpoints", [])
        if c.get("verified")
        and c.get("committed_at") is not None
        and c["committed_at"] < injected_at
        and not (damaged and damaged.startswith(_prefix_of(c["uri"])))
    ]
    newest_in_index = max(before, key=lambda c: c["step"])["uri"] if before else None
    # what the injector saw in the store as the fault went in; the run's final index may have lost it to retention
    report["newest_copy_before_fault"] = detail.get("newest_copy", newest_in_index)
    report["damaged"] = damaged or None
    broken = []
    if not report["injected"]:
        broken.append("the fault was never injected" + (f": {detail['skipped']}" if detail.get("skipped") else ""))
    if report["status"] != "succeeded":
        broken.append(f"the run did not succeed: {report.get('reason')}")
    if not report["resources_released"]:
        broken.append("resources were left behind")
    expected = EXPECTED_OUTCOME[plan.kind]
    if report["outcomes"] != [expected, "SUCCEEDED"]:
        broken.append(f"attempts were {report['outcomes']}, expected {[expected, 'SUCCEEDED']}")
    if report["detected_kind"] != expected:
        broken.append(f"detected as {report['detected_kind']}, expected {expected}")
    newest, resumed = report["newest_copy_before_fault"], report["resumed_from"]
    if newest is not None and (resumed is None or (step_of(resumed + "/") or 0) < (step_of(newest + "/") or 0)):
        broken.append(
            f"resumed from {resumed or 'nothing'}, not from the newest copy committed before the fault ({newest})"
        )
    if damaged and resumed and damaged.startswith(_prefix_of(resumed)):
        broken.append(f"resumed from the damaged copy {resumed}")
    report["broken_rules"] = broken
    report["passed"] = not broken
    return report


def _prefix_of(uri: str) -> str:
    """`<run id>/step-<n>/` of a checkpoint's URI, as a damaged file's key begins."""
    parts = uri.rstrip("/").split("/")
    return "/".join(parts[-2:]) + "/"


def phases_line(phases: dict | None) -> str:
    """A recovery's split into phases (contracts/recovery.py), as the drill prints it."""
    if not phases:
        return "no phase split recorded"
    return (
        ", ".join(f"{name.replace('_', ' ')} {value:.2f}" for name, value in phases.items() if value is not None) + " s"
    )


def newest_before_fault(plan: FaultPlan, report: dict, summary: dict, fault: dict, every_steps: int) -> int | None:
    """The newest step a checkpoint is known to have been committed at before the fault went in: a
    durable one at or before the fault's step, or the last save every rank had finished (see
    `last_finished_save`)."""
    step = report["injected_at_step"]
    if step is None:
        return None
    detail = fault.get("detail") or {}
    damaged = str(detail.get("damaged", ""))
    injected_at = fault.get("injected_at") or 0.0
    durable = [
        c["step"]
        for c in summary.get("checkpoints", [])
        if c.get("verified")
        and c["step"] <= step
        and f"step-{c['step']:08d}" not in damaged
        and c.get("committed_at") is not None
        and c["committed_at"] < injected_at
    ]
    finished = last_finished_save(step, every_steps, report["fault_at_gate"], report["slowest_step_at_fault"])
    if plan.kind == FaultKind.corrupt_checkpoint:
        finished -= every_steps  # the newest one is the one the fault damaged
    return max([*durable, max(0, finished)])


def gate_evidence(detail: dict) -> tuple[bool, int | None]:
    """From an injection's record: whether every rank stood at the fault gate, and the slowest
    rank's reported step."""
    steps = [int(s) for s in (detail.get("steps") or {}).values()]
    return bool(detail.get("at_gate")), min(steps) if steps else None


def last_finished_save(fault_step: int, every_steps: int, at_gate: bool = True, slowest_step: int | None = None) -> int:
    """The newest scheduled save every rank had finished when the fault went in (may be negative:
    none). A save begins only once the one before it is finished, and a rank at the fault gate has
    begun the save of its step: the save before that one is finished. Without the gate, a rank
    seen at step m may still be waiting in the save of step m (it reports a step, then saves it),
    so only the saves before m's are known to have begun."""
    begun_through = fault_step if at_gate else (fault_step if slowest_step is None else slowest_step) - 1
    return (begun_through // every_steps) * every_steps - every_steps


def lost_steps_limit(fault_step: int, every_steps: int, at_gate: bool = True, slowest_step: int | None = None) -> int:
    """The most steps a fault at `fault_step` may cost: back to the last save every rank had
    finished, one checkpoint interval plus the steps of the asynchronous save that may still be in
    flight."""
    return fault_step - last_finished_save(fault_step, every_steps, at_gate, slowest_step)


def broken_rules(plan: FaultPlan, report: dict, every_steps: int) -> list[str]:
    """Every target the drill missed, each in a sentence; none means it passed.

    1. the fault went in, at the step asked for (+-1), and the run succeeded with everything released
    2. the attempts are exactly the injected fault, detected as its own kind, then success
    3. lost steps <= checkpoint.every_steps, plus the steps of a save in flight (0 for a preemption)
    4. the retry resumed from the newest checkpoint committed before the fault
    5. the final parameters equal the baseline's wherever the world size was kept
    6. a lost node replaced later: the job shrank, then grew back to its size at a checkpoint, losing no step
    7. in-process restart: the exception, crash, kill or hang was recovered in the attempt, every other rank
       process kept (the dead one replaced), at most the memory copies' interval lost (one step where
       they come every step)"""
    broken = []
    if not report["injected"]:
        return ["the fault was never injected"]
    at = report["injected_at_step"]
    if at is not None and abs(at - plan.at_step) > 1:
        broken.append(f"injected at step {at}, not at {plan.at_step} (+-1)")
    if report["status"] != "succeeded":
        broken.append(f"the run did not succeed: {report.get('reason')}")
    if not report["resources_released"]:
        broken.append("resources were left behind")
    expected = EXPECTED_OUTCOME[plan.kind]
    wanted = [expected, "SUCCEEDED"] if expected else ["SUCCEEDED"]
    if report["in_place"] and plan.kind in RECOVERED_IN_PLACE:
        wanted = ["SUCCEEDED"]
        world, replaced = report["world_sizes"][0], RECOVERED_IN_PLACE[plan.kind]
        if report["ranks_kept"] is None:
            broken.append("no recovery in place was recorded")
        elif (report["ranks_kept"], report["ranks_replaced"]) != (world - replaced, replaced):
            broken.append(
                f"{report['ranks_kept']} rank process(es) kept and {report['ranks_replaced']} replaced, "
                f"expected {world - replaced} kept and {replaced} replaced"
            )
        # the copies come every N steps (every step while that costs <= 2% of the step time)
        allowed = max(1, report["memory_copy_every_steps"] or 1)
        if report["lost_steps"] > allowed:
            broken.append(f"lost {report['lost_steps']} steps in place, more than the copies' interval ({allowed})")
    if plan.replaced_later:
        wanted = [expected, "RESIZED", "SUCCEEDED"]
        sizes = report["world_sizes"]
        if len(sizes) == len(wanted) and not sizes[0] == sizes[2] > sizes[1]:
            broken.append(f"world sizes were {sizes}: expected a shrink, then the first size back")
        if report["resize_lost_steps"]:
            broken.append(f"growing back lost {report['resize_lost_steps']} step(s), expected 0")
    if report["outcomes"] != wanted:
        broken.append(f"attempts were {report['outcomes']}, expected {wanted}")
    kind = expected or DETECTED_WITHOUT_FAILURE.get(plan.kind)
    if kind is not None and report["detected_kind"] != kind:
        broken.append(f"detected as {report['detected_kind']}, expected {kind}")
    fault_step = at if at is not None else plan.at_step
    limit = (
        0
        if plan.kind == FaultKind.preempt
        else lost_steps_limit(fault_step, every_steps, report["fault_at_gate"], report["slowest_step_at_fault"])
    )
    lost_limit_applies = plan.kind not in (FaultKind.corrupt_checkpoint,) and not (
        plan.kind == FaultKind.node_loss and plan.permanent
    )  # a lost node's local copies are gone with it
    if lost_limit_applies and report["lost_steps"] > limit:
        broken.append(f"lost {report['lost_steps']} steps, more than {limit}")
    newest = report.get("newest_checkpoint_before_fault")
    resumed = report["resumed_from_step"]
    if (
        expected
        and not report["in_place"]
        and resumed is not None
        and newest is not None
        and resumed < newest
        and lost_limit_applies
    ):
        broken.append(
            f"resumed from step {resumed}, older than the newest checkpoint committed before the fault (step {newest})"
        )
    world_kept = not (plan.kind == FaultKind.node_loss and plan.permanent)
    if world_kept and not report["params_match_baseline"]:
        broken.append("final parameters differ from the baseline's (params_sha256)")
    return broken


def baseline_failed_report(plan: FaultPlan, summary: dict) -> dict:
    """What a drill says when its fault-free baseline did not succeed: nothing to compare with."""
    return {
        "fault": plan.kind.value,
        "injected": False,
        "target": None,
        "at_step": plan.at_step,
        "status": "baseline-failed",
        "reason": summary.get("reason"),
        "outcomes": [],
        "detected_kind": None,
        "detection_latency_s": None,
        "recovery_s": None,
        "recovery_phases": None,
        "torchrun_restart_s": None,
        "lost_steps": None,
        "resumed_from_step": None,
        "goodput": None,
        "params_match_baseline": False,
        "resources_released": bool(summary.get("teardown", {}).get("clean")),
        "baseline_mlflow_run_id": summary.get("mlflow_run_id"),
        "broken_rules": [f"the fault-free baseline failed: {summary.get('reason')}"],
        "passed": False,
    }
