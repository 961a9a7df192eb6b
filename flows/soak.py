"""Soak: one longer job with many faults of every kind injected at random steps (optionally with a
CPU hog beside it), next to a fault-free baseline, and how every fault was detected.

    trainflow soak examples/digits/spec.yaml --faults 8 --seed 1 --load --json
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from prefect import flow, get_run_logger
from prefect.states import Completed, Failed, State

from flows.drill import run_lifecycle, storage_proxy
from trainflow.backends.processes import describe, job_processes
from trainflow.drills.chaos import FaultKind, FaultPlan
from trainflow.drills.cpu_load import cpu_load
from trainflow.drills.drill import baseline_key, load_baseline, save_baseline
from trainflow.drills.soak import plan_faults, render_confusion, soak_kinds, soak_report, soak_spec
from trainflow.prefect.run_names import given_or
from trainflow.prefect.verdicts import publish_soak
from trainflow.repro.environment import fingerprint_environment
from trainflow.runspec import RunSpec, load_spec


@contextmanager
def storage_outages(plans: list[FaultPlan]):
    """One storage relay for the whole faulted run when any fault is a storage outage; every such
    fault cuts that relay."""
    outage = next((p for p in plans if p.kind == FaultKind.storage_outage), None)
    if outage is None:
        yield plans
        return
    with storage_proxy(outage) as routed:
        yield [
            p.model_copy(update={"proxy_port": routed.proxy_port}) if p.kind == FaultKind.storage_outage else p
            for p in plans
        ]


@flow(name="soak", flow_run_name=given_or("{spec.name}-soak-{faults}-faults"))
def soak(
    spec: RunSpec,
    faults: int,
    seed: int = 0,
    load: bool = False,
    load_niceness: int = 0,
    kinds: list[FaultKind] | None = None,
) -> State:
    """Baseline (reused when one exists), the faulted run, the confusion matrix and the rest."""
    logger = get_run_logger()
    kinds, not_soaked = soak_kinds(spec, kinds)
    spec = soak_spec(spec, faults, kinds)
    plans = plan_faults(spec, faults, seed, kinds)
    key = baseline_key(spec, fingerprint_environment().fingerprint)
    baseline = load_baseline(key)
    if baseline is None:
        base_summary = run_lifecycle(spec)
        if base_summary["status"] != "succeeded":
            reason = f"the fault-free baseline failed: {base_summary['reason']}"
            return Failed(
                message=f"soak of {faults} faults: {reason}",
                data={"faults": faults, "passed": False, "status": "baseline-failed", "reason": base_summary["reason"]},
            )
        baseline = save_baseline(key, base_summary)
    with cpu_load(os.cpu_count() if load else None, load_niceness) as hog, storage_outages(plans) as routed:
        summary = run_lifecycle(spec, chaos=routed)
    leftovers = [describe(p) for p in job_processes(summary["run_id"])] + list(summary["teardown"]["survivors"])
    report = soak_report(plans, summary, baseline, leftovers, spec.checkpoint.every_steps)
    report["seed"], report["kinds"], report["kinds_not_soaked"] = seed, [k.value for k in kinds], not_soaked
    report["load"] = hog.model_dump() if hog else None
    logger.info(
        "soak of %d faults: %s\n%s", faults, "PASSED" if report["passed"] else "FAILED", render_confusion(report)
    )
    publish_soak(spec.name, report, summary, render_confusion(report))
    verdict = f"soak of {faults} faults: {'PASSED' if report['passed'] else 'FAILED'} ({report.get('reason')})"
    return (Completed if report["passed"] else Failed)(message=verdict, data=report)


if __name__ == "__main__":
    soak(load_spec(sys.argv[1]), faults=int(sys.argv[2]), seed=int(sys.argv[3]) if len(sys.argv) > 3 else 0)
