"""The training lifecycle: one flow run carries a distributed job from spec to teardown.

    validate -> track -> wait for quota -> provision -> prepare image -> attempt k: launch, watch
    (snapshot each commit), release, classify -> retry branch: back off, replace or exclude the
    failed node, resume from the latest verified checkpoint -> finalize -> teardown and release
    quota (always)

Every task takes what it uses and nothing more, so the flow run's graph in Prefect is this lifecycle.
Prefect links a task to the tasks whose results it takes by walking into its arguments, and it
matches objects by identity, so a shared enum member or string inside a result would link tasks
that share nothing. Results are therefore handed on `opaque`: a task is linked to the task that
made each argument, never to what the argument holds (hand-off records are plain classes, which
Prefect does not walk into; see trainflow/prefect/records.py).

Run it with `trainflow run SPEC`, from a deployment, or directly: `python -m flows.lifecycle SPEC`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from itertools import count

from prefect import flow
from prefect.exceptions import TerminationSignal
from prefect.states import Completed, Failed
from prefect.utilities.annotations import opaque
from pydantic import Field

from tasks.attempts import classify_outcome, recover_nodes, release_attempt
from tasks.chaos import inject_fault
from tasks.finalize import finalize
from tasks.image import prepare_image
from tasks.launch import choose_retry_point, find_resume_point, launch_attempt
from tasks.provision import provision
from tasks.quota import release_quota, wait_for_quota
from tasks.snapshot import snapshot_checkpoint
from tasks.teardown import teardown
from tasks.tracking import start_tracking
from tasks.validate import validate_spec
from tasks.watch import watch_attempt
from trainflow.contracts import RunSummary
from trainflow.drills.chaos import FaultPlan
from trainflow.orchestrator.failures import in_place_budget
from trainflow.orchestrator.interrupts import signal_name, teardown_not_interrupted
from trainflow.orchestrator.live import LiveRun
from trainflow.prefect.attempt_states import failed_attempts, watched_result
from trainflow.prefect.run_names import given_or
from trainflow.prefect.ui import report_attempt, report_checkpoint, report_run, start_report
from trainflow.run_id import checked_run_id, new_run_id
from trainflow.runspec import RunSpec, load_spec


@flow(name="training-lifecycle", flow_run_name=given_or("{spec.name}"))
def training_lifecycle(
    spec: RunSpec,
    resume: bool = Field(
        default=False,
        title="Resume",
        description="Start from the newest verified checkpoint under the spec's checkpoint URI, whichever run "
        "wrote it, instead of step 0.",
    ),
    run_id: str | None = Field(
        default=None,
        title="Run id",
        description="The trainflow run id, which names the MLflow run and the checkpoints, and the flow run "
        "unless you named it (then it is the run's tag run-id:ID). Default: a new one, the spec's name and a "
        "timestamp.",
    ),
):
    """Train `spec` to its last step, recovering from failures; with `resume`, continue from the
    newest verified checkpoint under the spec's checkpoint URI. `run_id`: the id a caller chose
    ahead (`trainflow run`, for what it started before the flow); by default a new one."""
    return lifecycle(spec, resume, run_id=run_id)


@flow(name="faulted-lifecycle", flow_run_name="{spec.name}-with-faults")
def faulted_lifecycle(spec: RunSpec, chaos: list[FaultPlan]):
    """The same lifecycle with faults injected from outside, each into the attempt it names
    (drills and benchmarks; kept out of the manual-run form)."""
    return lifecycle(spec, resume=False, chaos=chaos)


def lifecycle(spec: RunSpec, resume: bool, chaos: list[FaultPlan] | None = None, run_id: str | None = None):
    spec = validate_spec(spec)
    run_id = checked_run_id(run_id) if run_id else new_run_id(spec)
    with LiveRun(run_id) as live:  # the run's processes, channel and clients: closed when the flow leaves
        return run_lifecycle(spec, resume, chaos, run_id, live)


def run_lifecycle(spec: RunSpec, resume: bool, chaos: list[FaultPlan] | None, run_id: str, live: LiveRun):
    record = provisioned = launched = summary = quota = None
    stopped_by = None
    try:
        record = start_tracking(opaque(spec), resume, run_id)
        start_report(record)
        quota = wait_for_quota(record)  # held from here until after teardown
        provisioned = provision(record, live)
        ready = prepare_image(provisioned)
        restore_from = find_resume_point(provisioned) if resume else None
        attempt_spec, results, snapshots, injections = None, [], [], []  # None: the run's own spec
        for attempt in count(1):
            faults = [plan for plan in chaos or [] if plan.attempt == attempt]
            # the workers wait at each fault's step; a fault at a time (plain scripts) has no step to wait at
            gates = tuple(sorted({plan.at_step for plan in faults if plan.at_s is None}))
            # the recoveries in place its ranks may make: what the retry budgets have left
            in_place = in_place_budget(spec.fault_tolerance, results)
            launched = launch_attempt(ready, attempt, opaque(attempt_spec), opaque(restore_from), gates, in_place)
            injecting = [inject_fault.submit(launched, opaque(plan)) for plan in faults]
            # watch in the background; meanwhile snapshot each commit it passes on, until it ends
            # (the feed ends with the task, whether it returned or raised)
            commits = live.commit_feed(attempt)
            watching = watch_attempt.submit(launched, commits)
            commits.end_when_done(watching)
            for commit in commits:
                snapshots.append(snapshot_checkpoint(launched, opaque(commit)))
                report_checkpoint(record, snapshots[-1])
            result = release_attempt(launched, opaque(watched_result(watching)))  # a failed attempt's watch is Failed
            injections += [future.result() for future in injecting]
            results.append(result)
            # after a failed attempt its state is named after the branch, and holds the decision
            decision = classify_outcome(launched, each(results), return_state=True).result()
            report_attempt(record, result, decision)
            if not decision.retry:
                break
            time.sleep(decision.backoff_s)
            attempt_spec = recover_nodes(launched, opaque(result))
            restore_from = choose_retry_point(launched, resume, opaque(restore_from))
        summary = finalize(launched, each(results), opaque(decision), each(snapshots))
        if chaos:
            summary["faults"] = [asdict(injection) for injection in injections]
    except BaseException as exc:
        stopped_by = stopping_signal(exc)
        raise
    finally:
        with teardown_not_interrupted():
            try:
                released = teardown(opaque(spec), run_id, record, provisioned, launched, opaque(summary), stopped_by)
            finally:
                if quota is not None:
                    release_quota(quota)
    summary["teardown"] = released
    summary["quota"] = quota.as_dict() if quota else None
    report_run(record, summary)
    if summary["status"] == "succeeded":
        return Completed(
            message="finished" + RunSummary.model_validate(summary).at_step() + failed_attempts(summary), data=summary
        )
    return Failed(message=summary["reason"] + failed_attempts(summary), data=summary)


def each(values: list) -> list:
    """A list handed to a task item by item: the task depends on the task that made each item."""
    return [opaque(value) for value in values]


def stopping_signal(exc: BaseException) -> str | None:
    """The signal that stopped the flow (SIGINT, SIGTERM), or None when something else did."""
    if isinstance(exc, TerminationSignal):  # Prefect's own SIGTERM handler, active while a flow runs
        return signal_name(exc.signal)
    if isinstance(exc, KeyboardInterrupt):
        return str(exc) or "SIGINT"  # the CLI raises KeyboardInterrupt("SIGTERM") for SIGTERM
    return None


if __name__ == "__main__":
    training_lifecycle(load_spec(sys.argv[1], sys.argv[2:]))
