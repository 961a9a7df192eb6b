"""Fault drill: run a job with one fault injected from outside, next to a fault-free baseline of
the same job, and report detection, recovery, lost steps and whether the resume was exact.

    trainflow drill examples/digits/spec.yaml --fault preempt --at-step 30 --json
    python -m flows.drill examples/digits/spec.yaml crash 30
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from urllib.parse import urlparse

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, Failed, State
from pydantic import Field

from flows.lifecycle import faulted_lifecycle, training_lifecycle
from trainflow.backends.processes import describe, job_processes
from trainflow.drills.bench.torchrun_restart import measure_torchrun_restart
from trainflow.drills.chaos import FaultKind, FaultPlan
from trainflow.drills.drill import (
    baseline_failed_report,
    baseline_key,
    check_plan,
    drill_report,
    drill_spec,
    load_baseline,
    save_baseline,
)
from trainflow.drills.storage_proxy import StorageProxy
from trainflow.prefect.run_names import given_or
from trainflow.prefect.verdicts import publish_drill
from trainflow.repro.environment import fingerprint_environment
from trainflow.runspec import RunSpec, load_spec


@task(name="measure-torchrun-restart", cache_policy=NO_CACHE, persist_result=False)
def torchrun_restart_s() -> float | None:
    """torchrun's own worker restart on this machine, the yardstick for recovery time."""
    try:
        return measure_torchrun_restart()
    except RuntimeError as exc:
        get_run_logger().warning("torchrun restart not measured: %s", exc)
        return None


@contextmanager
def storage_proxy(plan: FaultPlan):
    """For storage-outage drills: route the job's S3 traffic through a relay the drill can cut."""
    if plan.kind != FaultKind.storage_outage:
        yield plan
        return
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        raise ValueError("storage-outage drills need AWS_ENDPOINT_URL_S3 (an S3-compatible endpoint)")
    upstream = urlparse(endpoint)
    proxy = StorageProxy(upstream.hostname, upstream.port or (443 if upstream.scheme == "https" else 80))
    previous = os.environ.get("AWS_ENDPOINT_URL_S3")
    os.environ["AWS_ENDPOINT_URL_S3"] = f"{upstream.scheme}://127.0.0.1:{proxy.port}"
    try:
        yield plan.model_copy(update={"proxy_port": proxy.port})
    finally:
        proxy.close()
        if previous is None:
            os.environ.pop("AWS_ENDPOINT_URL_S3", None)
        else:
            os.environ["AWS_ENDPOINT_URL_S3"] = previous


def run_lifecycle(spec: RunSpec, chaos: list[FaultPlan] | None = None) -> dict:
    if chaos:
        state = faulted_lifecycle(spec, chaos, return_state=True)
    else:
        state = training_lifecycle(spec, return_state=True)
    summary = state.result(raise_on_failure=False)
    if not isinstance(summary, dict):
        raise RuntimeError(f"the lifecycle crashed: {state.message}")
    return summary


@flow(name="fault-drill", flow_run_name=given_or("{spec.name}-{fault.kind.value}"))
def fault_drill(
    spec: RunSpec,
    fault: FaultPlan,
    fresh_baseline: bool = Field(
        default=False,
        title="Fresh baseline",
        description="Run the fault-free baseline again, even where one for this job and environment is kept.",
    ),
    compare_torchrun: bool = Field(
        default=True,
        title="Compare with torchrun",
        description="Also time torchrun's own restart of the job, the yardstick the recovery is reported against.",
    ),
) -> State:
    """Baseline (reused when one exists for this job and environment), the faulted run, the report."""
    logger = get_run_logger()
    check_plan(spec, fault)
    spec = drill_spec(spec, fault)
    key = baseline_key(spec, fingerprint_environment().fingerprint)
    baseline = None if fresh_baseline else load_baseline(key)
    if fault.at_s is not None:  # a plain script has no parameter hash to compare: no baseline to run
        baseline = {}
    elif baseline is None:
        logger.info("running the fault-free baseline")
        base_summary = run_lifecycle(spec)
        if base_summary["status"] != "succeeded":
            logger.error("the fault-free baseline failed: %s", base_summary["reason"])
            return drill_state(baseline_failed_report(fault, base_summary))
        baseline = save_baseline(key, base_summary)
    else:
        logger.info("reusing baseline %s (params %s)", baseline["run_id"], baseline["params_sha256"][:12])
    with storage_proxy(fault) as plan:
        summary = run_lifecycle(spec, chaos=[plan])
    leftovers = list(summary.get("teardown", {}).get("survivors", []))
    leftovers += [describe(p) for p in job_processes(summary["run_id"])]
    released = bool(summary.get("teardown", {}).get("clean")) and not leftovers
    yardstick = torchrun_restart_s() if compare_torchrun else None
    report = drill_report(
        fault,
        summary,
        baseline,
        yardstick,
        released,
        spec.checkpoint.every_steps,
        spec.fault_tolerance.in_process_restart,
    )
    report["leftovers"] = leftovers
    logger.info("drill %s: %s", fault.kind.value, "PASSED" if report["passed"] else "FAILED")
    for rule in report["broken_rules"]:
        logger.warning("drill rule broken: %s", rule)
    publish_drill(spec.name, report, summary)  # the report as a Prefect artifact, and on the faulted MLflow run
    return drill_state(report)


def drill_state(report: dict) -> State:
    """The drill flow run's final state: Completed when the drill passed, Failed naming what broke;
    either carries the report."""
    fault = report["fault"]
    if report.get("passed"):
        detected = f"detected as {report['detected_kind']}"
        if report.get("detection_latency_s") is not None:
            detected += f" in {report['detection_latency_s']:g}s"
        if report.get("recovery_s") is not None:
            detected += f", recovered in {report['recovery_s']:g}s"
        if report.get("params_match_baseline"):
            detected += ", final parameters equal to the baseline's"
        return Completed(message=f"drill {fault}: PASSED: {detected}", data=report)
    return Failed(message=f"drill {fault}: FAILED: " + "; ".join(report.get("broken_rules") or []), data=report)


if __name__ == "__main__":
    fault_drill(load_spec(sys.argv[1]), FaultPlan(kind=sys.argv[2], at_step=int(sys.argv[3])))
