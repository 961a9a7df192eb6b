"""find_resume_point, choose_retry_point and launch_attempt: where an attempt starts from, and starting it."""

from __future__ import annotations

import time

from prefect import get_run_logger

from tasks import lifecycle_task
from tasks.attempts import open_attempt_run
from trainflow.backends import AttemptPlan
from trainflow.backends.abilities import SharesScratch
from trainflow.checkpoint.catalog import Committed, latest_verified
from trainflow.checkpoint.storage import StorageError
from trainflow.prefect.records import Launched, Provisioned, Ready
from trainflow.repro.environment import Environment
from trainflow.runspec import RunSpec


# the checkpoint store may be briefly unreachable (the reason for the retry, often): wait for it
# rather than resume from the wrong place
@lifecycle_task(name="find-resume-point", retries=4, retry_delay_seconds=[2, 4, 8, 16])
def find_resume_point(provisioned: Provisioned) -> Committed | None:
    """The newest verified checkpoint of any run under the spec's checkpoint URI."""
    spec = provisioned.record.spec
    found = latest_verified(provisioned.storage)
    logger = get_run_logger()
    if found is None:
        logger.info("no verified checkpoint under %s: starting from step 0", spec.checkpoint.uri)
    else:
        logger.info("resuming from step %d (%s)", found.step, found.prefix)
    return found


RETRY_POINT_WAITS_S = (2, 4, 8, 16)  # between reads of a store that does not answer


@lifecycle_task(name="choose-retry-point", task_run_name="choose-retry-point-after-attempt-{failed.attempt}")
def choose_retry_point(failed: Launched, resume: bool, previous: Committed | None) -> Committed | None:
    """Where the next attempt resumes: the newest verified checkpoint of this run; with none and
    `resume`, the newest of any run, chosen again (the one chosen before may be gone: another
    run's retention). A store that stays unreadable is no reason to stop the run: the attempt
    resumes from `previous` (its nodes' own copies come first anyway), and a restore that fails
    there ends it as INFRA, on the retry branch. `failed` is the attempt that just ended."""
    logger = get_run_logger()
    spec, run_id, storage = failed.record.spec, failed.record.run_id, failed.provisioned.storage
    for wait_s in (*RETRY_POINT_WAITS_S, None):
        try:
            found = latest_verified(storage, run_id)
            if found is None and resume:
                found = latest_verified(storage)
            break
        except StorageError as exc:
            if wait_s is None:
                logger.warning(
                    "checkpoint store unreadable (%s): resuming from %s",
                    exc,
                    f"step {previous.step} ({previous.prefix})" if previous else "the nodes' own copies",
                )
                return previous
            logger.warning("checkpoint store unreadable, trying again in %ds: %s", wait_s, exc)
            time.sleep(wait_s)
    # the ranks restore the newest copy that verifies, and a node-local one may be newer than this
    local = " (or from a newer copy on the nodes' own disks)" if spec.checkpoint.local_tier else ""
    if found is None:
        logger.info("no verified checkpoint under %s: resuming from step 0%s", spec.checkpoint.uri, local)
    else:
        logger.info("resuming from step %d (%s)%s", found.step, found.prefix, local)
    return found


def code_version(environment: Environment) -> str:
    return environment.git_commit[:12] + ("-dirty" if environment.git_dirty else "")


@lifecycle_task(name="launch-attempt", task_run_name="launch-attempt-{attempt}")
def launch_attempt(
    ready: Ready,
    attempt: int,
    spec: RunSpec | None,
    restore_from: Committed | None,
    pause_at_steps: tuple[int, ...] = (),
    in_place_budget: dict[str, int] | None = None,
) -> Launched:
    """Start every node of attempt `attempt` with `spec` (None: the run's own), resuming from
    `restore_from` when given; with `pause_at_steps`, the workers wait at each for a drill's fault;
    `in_place_budget`: the recoveries in place its ranks may make, by outcome."""
    provisioned = ready.provisioned
    record = provisioned.record
    spec = spec or record.spec
    provisioned.channel.begin_attempt(attempt, world_size=spec.world_size)
    plan = AttemptPlan(
        attempt=attempt,
        status_address=provisioned.channel.address,
        status_token=provisioned.channel.token,
        code_version=code_version(ready.environment),
        restore_prefix=restore_from.prefix if restore_from else None,
        # only where the orchestrator and the workers share the run's scratch folder
        pause_at_steps=tuple(pause_at_steps) if isinstance(provisioned.launcher, SharesScratch) else (),
        in_place_budget=dict(in_place_budget or {}),
    )
    handle = provisioned.launcher.launch(spec, provisioned.allocation, plan)
    handle.pause_at_steps = plan.pause_at_steps  # the drill's injector waits for every rank there
    handle.in_place_budget = plan.in_place_budget  # a frozen rank may be replaced in place (watcher.py)
    resumed_from_step = restore_from.step if restore_from else 0
    attempt_run_id = open_attempt_run(provisioned, spec, attempt, handle.started_at, resumed_from_step)
    newer_local = " or a newer node-local copy" if attempt > 1 and spec.checkpoint.local_tier else ""
    if spec.workload.mode.value == "plain":  # no steps: the script's own folder, or nothing, is restored
        resumed_from_step = 0
        newer_local = (
            f" (its folder restored from copy {restore_from.prefix})"
            if restore_from and spec.workload.plain.checkpoint_dir
            else ""
        )
    # the node folder goes at teardown: point at where the logs are kept
    get_run_logger().info(
        "attempt %d: %d node(s) started (%d warm) from step %d%s; its metrics go to MLflow run %s, nested run "
        "%s-attempt-%d (%s), and its logs too (artifacts logs/) once it ends",
        attempt,
        handle.nodes,
        handle.warm_nodes,
        resumed_from_step,
        newer_local,
        record.mlflow_run_id,
        record.run_id,
        attempt,
        attempt_run_id,
    )
    return Launched(ready, spec, handle, resumed_from_step, attempt_run_id)
