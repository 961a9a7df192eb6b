"""inject_fault: a drill's fault, injected into a running attempt from outside the workload."""

from __future__ import annotations

from prefect import get_run_logger

from tasks import lifecycle_task
from trainflow.drills.chaos import FaultPlan, Injection, inject
from trainflow.home import resolve_checkpoint_uri
from trainflow.prefect.records import Launched


@lifecycle_task(name="inject-fault", task_run_name="inject-{plan.kind.value}-{plan.moment}")
def inject_fault(launched: Launched, plan: FaultPlan) -> Injection:
    """Wait for the planned step (or time), then break what the plan says."""
    spec, provisioned = launched.spec, launched.provisioned
    injection = inject(
        plan,
        provisioned.launcher,
        launched.handle,
        provisioned.channel,
        provisioned.allocation,
        resolve_checkpoint_uri(spec.checkpoint.uri),
        spec.world_size,
    )
    logger = get_run_logger()
    if injection.injected:
        logger.warning("injected %s into %s", injection.kind, injection.target)
    else:
        logger.info("fault not injected: %s", injection.detail.get("skipped"))
    return injection
