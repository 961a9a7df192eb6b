"""The reference goodput drill: a run long enough and heavy enough for goodput to mean something.

The digits workload at a width where a step takes tens of milliseconds on this machine, a
checkpoint every few seconds, and three faults of different kinds (a crash, a preemption, a
SIGKILL) at a quarter, half and three quarters of the run, each half a checkpoint interval after a
checkpoint (a fault's expected loss), about three minutes in all. Goodput is the run's productive
share of its wall time (contracts/ledger.py), start-up included."""

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

_SCRIPT = """
import json, sys
from flows.lifecycle import faulted_lifecycle
from trainflow.drills.chaos import FaultPlan
from trainflow.runspec import load_spec
settings = json.loads(sys.argv[1])
spec = load_spec("examples/digits/spec.yaml", settings["overrides"])
plans = [FaultPlan(kind=kind, at_step=step, attempt=attempt)
         for attempt, (kind, step) in enumerate(settings["faults"], start=1)]
summary = faulted_lifecycle(spec, plans, return_state=True).result(raise_on_failure=False)
print(json.dumps({k: summary[k] for k in ("status", "goodput", "attempts", "costs", "final_step")}, default=str))
"""


def reference_goodput(env: dict) -> dict:
    faults = [(kind, int(STEPS * share) + FAULT_OFFSET) for kind, share in FAULTS]
    overrides = [
        f"workload.steps={STEPS}",
        f"checkpoint.every_steps={CHECKPOINT_EVERY}",
        f"workload.args=['--hidden', '{HIDDEN}', '--global-batch', '{GLOBAL_BATCH}']",
    ]
    settings = json.dumps({"overrides": overrides, "faults": faults})
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, settings], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    lines = result.stdout.strip().splitlines()
    if not lines:
        return {"error": result.stderr[-2000:]}
    summary = json.loads(lines[-1])
    figures = summary["costs"]
    return {
        "status": summary["status"],
        "goodput": summary["goodput"],
        "target": TARGET,
        "met": summary["goodput"] is not None and summary["goodput"] >= TARGET,
        "faults": faults,
        "outcomes": [a["outcome"] for a in summary["attempts"]],
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
        "recovery_s": [a["recovery_s"] for a in summary["attempts"][1:]],
        "device_hours": figures["device_hours"],
        "wasted_device_hours": figures["wasted_device_hours"],
    }


def markdown(results: dict) -> list[str]:
    lines = [
        "## Goodput on the reference drill"
        + (f" (measured {results['measured_at']})" if "measured_at" in results else ""),
        "",
    ]
    if "error" in results:
        return lines + [f"not measured: {results['error'][:300]}", ""]
    step_ms = results["mean_step_time_s"] * 1000
    every_s = results["checkpoint_every_steps"] * results["mean_step_time_s"]
    faults = ", ".join(f"{kind} at step {step}" for kind, step in results["faults"])
    return lines + [
        f"The digits workload at hidden width {results['hidden']} and a global batch of {results['global_batch']} "
        f"({step_ms:.0f} ms steps here), {results['steps']} steps, a checkpoint every "
        f"{results['checkpoint_every_steps']} steps (every {every_s:.1f} s), and three faults: {faults} (each half "
        "an interval after a checkpoint, a fault's expected loss). Goodput is the productive share of the run's "
        "wall time, start-up included.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| goodput (target ≥ {results['target']:.2f}) "
        f"| {results['goodput']:.3f} ({'met' if results['met'] else 'not met'}) |",
        f"| outcomes | {', '.join(results['outcomes'])}; final status {results['status']} |",
        f"| wall time (s) | {results['wall_s']:.1f} |",
        f"| productive (s) | {results['productive_s']:.1f} |",
        f"| lost work (s) | {results['lost_work_s']:.1f} ({results['lost_steps']} steps) |",
        f"| detection, all faults (s) | {results['detection_s_total']:.2f} |",
        f"| recovery, all faults (s) | {results['recovery_s_total']:.2f} (each: "
        f"{', '.join(f'{r:.2f}' for r in results['recovery_s'] if r is not None)}) |",
        f"| checkpoint stalls (s) | {results['checkpoint_stall_total_s']:.2f} |",
        f"| other: start-up, teardown of attempts, reporting (s) | {results['other_s']:.1f} |",
        f"| device-hours, of which wasted | {results['device_hours']}, {results['wasted_device_hours']} |",
        "",
    ]
