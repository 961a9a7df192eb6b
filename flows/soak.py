"""Soak: one longer job with many faults of every kind injected at random steps (optionally with a
CPU hog beside it), next to a fault-free baseline, and how every fault was detected.

    trainflow soak examples/digits/spec.yaml --faults 8 --seed 1 --load --json
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

from prefect import flow, get_run_logger

from flows.drill import run_lifecycle
from trainflow.backends.processes import describe, job_processes
from trainflow.drill import baseline_key, load_baseline, save_baseline
from trainflow.environment import fingerprint_environment
from trainflow.soak import plan_faults, render_confusion, soak_report, soak_spec
from trainflow.spec import RunSpec, load_spec

HOG = "while True: pass"


@contextmanager
def cpu_hog(enabled: bool):
    """A process that keeps one core busy for as long as the soak runs, as other work on a shared host."""
    if not enabled:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


@flow(name="soak", flow_run_name="{spec.name}-soak-{faults}-faults")
def soak(spec: RunSpec, faults: int, seed: int = 0, load: bool = False) -> dict:
    """Baseline (reused when one exists), the faulted run, the confusion matrix and the rest."""
    logger = get_run_logger()
    spec = soak_spec(spec, faults)
    plans = plan_faults(spec, faults, seed)
    key = baseline_key(spec, fingerprint_environment().fingerprint)
    baseline = load_baseline(key)
    if baseline is None:
        base_summary = run_lifecycle(spec)
        if base_summary["status"] != "succeeded":
            return {"faults": faults, "passed": False, "status": "baseline-failed", "reason": base_summary["reason"]}
        baseline = save_baseline(key, base_summary)
    with cpu_hog(load):
        summary = run_lifecycle(spec, chaos=plans)
    leftovers = [describe(p) for p in job_processes(summary["run_id"])] + list(summary["teardown"]["survivors"])
    report = soak_report(plans, summary, baseline, leftovers, spec.checkpoint.every_steps)
    report["seed"], report["load"] = seed, load
    logger.info("soak of %d faults: %s\n%s", faults, "PASSED" if report["passed"] else "FAILED",
                render_confusion(report))
    return report


if __name__ == "__main__":
    soak(load_spec(sys.argv[1]), faults=int(sys.argv[2]), seed=int(sys.argv[3]) if len(sys.argv) > 3 else 0)
