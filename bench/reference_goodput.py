"""The reference goodput drill: a run long enough and heavy enough for goodput to mean something.

The digits workload at a width where a step takes tens of milliseconds on this machine, a
checkpoint every few seconds, and three faults of different kinds (a crash, a preemption, a
SIGKILL) at a quarter, half and three quarters of the run, each half a checkpoint interval after a
checkpoint (a fault's expected loss), about three minutes in all; run twice, recovering by restarts
and with in-process restart. Goodput is the run's productive share of its wall time
(contracts/ledger.py), start-up included."""

from __future__ import annotations

import json
import subprocess
import sys

from bench_common import ROOT

HIDDEN = 1536
GLOBAL_BATCH = 512
STEPS = 2400
CHECKPOINT_EVERY = 50
FAULTS = (("crash", 0.25), ("preempt", 0.5), ("kill", 0.75))
# each fault half a checkpoint interval after a checkpoint: what a fault at a random step loses on average
FAULT_OFFSET = CHECKPOINT_EVERY // 2
TARGET = 0.90
TARGET_IN_PLACE = 0.97  # with in-process restart
RECOVERED_IN_PLACE = ("crash", "kill")

_SCRIPT = """
import json, sys
from flows.lifecycle import faulted_lifecycle
from trainflow.drills.chaos import FaultPlan
from trainflow.runspec import load_spec
settings = json.loads(sys.argv[1])
spec = load_spec("examples/digits/spec.yaml", settings["overrides"])
plans = [FaultPlan(kind=kind, at_step=step, attempt=attempt) for kind, step, attempt in settings["faults"]]
summary = faulted_lifecycle(spec, plans, return_state=True).result(raise_on_failure=False)
print(json.dumps({k: summary[k] for k in ("status", "goodput", "attempts", "costs", "final_step")}, default=str))
"""


def reference_goodput(env: dict) -> dict:
    """The drill twice: each fault recovered by a restart of the whole job, and with
    `fault_tolerance.in_process_restart`, where the crash and the kill are recovered in place."""
    return {"restart": measure(env, in_place=False), "in_place": measure(env, in_place=True)}


def fault_plans(in_place: bool) -> list[tuple[str, int, int]]:
    """(kind, step, attempt) of each fault: a fault recovered in place leaves its attempt running,
    and the next fault goes into the same one."""
    plans, attempt = [], 1
    for kind, share in FAULTS:
        plans.append((kind, int(STEPS * share) + FAULT_OFFSET, attempt))
        if not (in_place and kind in RECOVERED_IN_PLACE):
            attempt += 1
    return plans


def measure(env: dict, in_place: bool) -> dict:
    plans = fault_plans(in_place)
    overrides = [
        f"workload.steps={STEPS}",
        f"checkpoint.every_steps={CHECKPOINT_EVERY}",
        f"workload.args=['--hidden', '{HIDDEN}', '--global-batch', '{GLOBAL_BATCH}']",
        *(["fault_tolerance.in_process_restart=true"] if in_place else []),
    ]
    settings = json.dumps({"overrides": overrides, "faults": plans})
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, settings], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    lines = result.stdout.strip().splitlines()
    if not lines:
        return {"error": result.stderr[-2000:]}
    summary = json.loads(lines[-1])
    figures = summary["costs"]
    rounds = [r for a in summary["attempts"] for r in a.get("in_place", [])]
    return {
        "status": summary["status"],
        "goodput": summary["goodput"],
        "target": TARGET_IN_PLACE if in_place else TARGET,
        "met": summary["goodput"] is not None and summary["goodput"] >= (TARGET_IN_PLACE if in_place else TARGET),
        "faults": [[kind, step] for kind, step, _ in plans],
        "outcomes": [a["outcome"] for a in summary["attempts"]],
        "in_place": [f"{r['outcome']} at step {r['failed_step']}" for r in rounds],
        "steps": STEPS,
        "hidden": HIDDEN,
        "global_batch": GLOBAL_BATCH,
        "checkpoint_every_steps": CHECKPOINT_EVERY,
        "mean_step_time_s": figures["mean_step_time_s"],
        "wall_s": figures["wall_s"],
        "productive_s": figures["productive_s"],
        "lost_steps": figures["lost_steps"],
        "lost_work_s": figures["lost_work_s"],
        "detection_s_total": figures["detection_s_total"],
        "recovery_s_total": figures["recovery_s_total"],
        "checkpoint_stall_total_s": figures["checkpoint_stall_total_s"],
        "other_s": figures["other_s"],
        "recovery_s": [r["recovery_s"] for r in rounds] + [a["recovery_s"] for a in summary["attempts"][1:]],
        "device_hours": figures["device_hours"],
        "wasted_device_hours": figures["wasted_device_hours"],
    }


def markdown(results: dict) -> list[str]:
    lines = [
        "## Goodput on the reference drill"
        + (f" (measured {results['measured_at']})" if "measured_at" in results else ""),
        "",
    ]
    runs = {name: results[name] for name in ("restart", "in_place") if name in results} or {"restart": results}
    failed = [f"{name}: {run['error'][:300]}" for name, run in runs.items() if "error" in run]
    if failed:
        return lines + [f"not measured: {'; '.join(failed)}", ""]
    first = next(iter(runs.values()))
    step_ms = first["mean_step_time_s"] * 1000
    every_s = first["checkpoint_every_steps"] * first["mean_step_time_s"]
    faults = ", ".join(f"{kind} at step {step}" for kind, step in first["faults"])
    names = {"restart": "restart of the whole job", "in_place": "`in_process_restart`"}
    row = lambda label, show: f"| {label} | " + " | ".join(show(r) for r in runs.values()) + " |"  # noqa: E731
    return lines + [
        f"The digits workload at hidden width {first['hidden']} and a global batch of {first['global_batch']} "
        f"({step_ms:.0f} ms steps here), {first['steps']} steps, a checkpoint every "
        f"{first['checkpoint_every_steps']} steps (every {every_s:.1f} s), and three faults: {faults} (each half "
        "an interval after a checkpoint, a fault's expected loss). Goodput is the productive share of the run's "
        "wall time, start-up included. With in-process restart the crash and the kill are recovered within the "
        "attempt (the dead rank replaced, the other kept); the preemption still ends its attempt.",
        "",
        "| figure | " + " | ".join(names[name] for name in runs) + " |",
        "|---|" + "---|" * len(runs),
        row("goodput", lambda r: f"{r['goodput']:.3f} (target ≥ {r['target']:.2f}: {'' if r['met'] else 'not '}met)"),
        row("attempts", lambda r: f"{', '.join(r['outcomes'])}; final status {r['status']}"),
        row("recovered in place", lambda r: ", ".join(r.get("in_place") or []) or "–"),
        row("wall time (s)", lambda r: f"{r['wall_s']:.1f}"),
        row("productive (s)", lambda r: f"{r['productive_s']:.1f}"),
        row("lost work (s)", lambda r: f"{r['lost_work_s']:.1f} ({r['lost_steps']} steps)"),
        row("detection, all faults (s)", lambda r: f"{r['detection_s_total']:.2f}"),
        row(
            "recovery, all faults (s)",
            lambda r: (
                f"{r['recovery_s_total']:.2f} (each: "
                + ", ".join(f"{x:.2f}" for x in r["recovery_s"] if x is not None)
                + ")"
            ),
        ),
        row("checkpoint stalls (s)", lambda r: f"{r['checkpoint_stall_total_s']:.2f}"),
        row("other: start-up, teardown of attempts, reporting (s)", lambda r: f"{r['other_s']:.1f}"),
        row("device-hours, of which wasted", lambda r: f"{r['device_hours']}, {r['wasted_device_hours']}"),
        "",
    ]
