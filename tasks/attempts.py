"""release_attempt, classify_outcome and recover_nodes: end an attempt completely, choose the
branch, and bring the failed node back (or leave it out) for the next attempt."""

from __future__ import annotations

import time

from prefect import get_run_logger
from prefect.runtime import task_run
from prefect.states import State

from tasks import lifecycle_task
from trainflow.backends import Allocation
from trainflow.backends.abilities import ReplacesNodes
from trainflow.orchestrator.failures import AttemptResult, Decision, Outcome, decide
from trainflow.orchestrator.rules import decide_by_rule, excluded_node
from trainflow.prefect.attempt_states import decided
from trainflow.prefect.records import Launched, Provisioned
from trainflow.runspec import RunSpec

STOP_GRACE_S = 3.0
# processes blocked in a collective, or cut off with a lost node, cannot act on SIGTERM: a long grace
# for them only delays the next attempt (what they wrote without a manifest is never loaded). Not 0:
# that would be a force deletion on Kubernetes, which leaves containers running on their node.
UNRESPONSIVE = frozenset({Outcome.HUNG, Outcome.NODE_LOST})
UNRESPONSIVE_GRACE_S = 0.5


@lifecycle_task(name="release-attempt", task_run_name="release-attempt-{launched.handle.attempt}")
def release_attempt(launched: Launched, result: AttemptResult) -> AttemptResult:
    """Stop whatever is left of the attempt and close its nested MLflow run with its outcome, figures
    and logs; the result is the attempt's, for the tasks that decide what comes next."""
    provisioned, handle = launched.provisioned, launched.handle
    # by now the outcome is known and a preempted attempt has saved; what is left only needs ending
    stopped = provisioned.launcher.stop(handle, grace_s=grace_for(result.outcome))
    result.stopped_at = time.time()  # the end of the next recovery's stop phase (contracts/recovery.py)
    tracker, child = provisioned.tracker, launched.attempt_run_id
    tracker.set_tags(child, {"outcome": result.outcome.value})
    if result.resumed_from:  # a plain script's own checkpoint copy, known once its nodes restored it
        tracker.log_params(child, {"resumed_from": result.resumed_from})
    tracker.log_metrics(
        child,
        [
            (key, value, result.attempt, result.ended_at)
            for key, value in {
                "last_step": result.last_step,
                "duration_s": result.ended_at - result.started_at,
                "detection_latency_s": result.detection_latency_s,
            }.items()
            if value is not None
        ],
    )
    stacks, result.evidence.stacks = result.evidence.stacks, {}  # files of their own, not carried on
    tracker.log_json(child, {"reason": result.reason, **result.evidence.as_dict()}, "evidence.json")
    for rank, text in stacks.items():
        tracker.log_text(child, text, f"stacks/rank-{rank}.txt")
    for path in handle.logs.values():  # the workers' own output, and torchrun's error files
        if path.exists():
            tracker.log_file(child, path, "logs")
    attempt_dir = next(iter(handle.logs.values())).parent if handle.logs else None
    for index, error_file in enumerate(sorted(attempt_dir.glob("torchrun/**/error.json")) if attempt_dir else []):
        tracker.log_file(child, error_file, f"logs/errors/{index}")
    # each rank's last stderr lines (all of its stderr, bounded, is in its node's log):
    # torchrun/node-<k>/rank-<local rank>.stderr
    for stderr_file in sorted(attempt_dir.glob("torchrun/node-*/rank-*.stderr")) if attempt_dir else []:
        local_rank = stderr_file.stem.removeprefix("rank-")
        tracker.log_file(child, stderr_file, f"logs/stderr/{stderr_file.parent.name}/local-rank-{local_rank}")
    tracker.set_tags(child, {"reason": result.reason[:5000]})
    # the attempt's own span, as the run's summary has it, not the time these writes took
    tracker.end_run(child, "FINISHED" if result.outcome.value == "SUCCEEDED" else "FAILED", end_time=result.ended_at)
    if child is None:
        get_run_logger().warning(
            "attempt %d released (%d process(es) stopped); not recorded: the tracking store "
            "is down (its logs are kept at teardown)",
            result.attempt,
            stopped,
        )
    else:
        get_run_logger().info(
            "attempt %d released (%d process(es) stopped); its logs: MLflow run %s, artifacts logs/",
            result.attempt,
            stopped,
            child,
        )
    return result


def open_attempt_run(
    provisioned: Provisioned, spec: RunSpec, attempt: int, started_at: float, resumed_from_step: int
) -> str | None:
    """The attempt's nested MLflow run, opened as the attempt starts: it carries the attempt's
    metrics as they come, and spans the attempt's real start and end."""
    record = provisioned.record
    child = provisioned.tracker.start_run(
        record.experiment,
        run_name=f"{record.run_id}-attempt-{attempt}",
        tags={"trainflow.run_id": record.run_id, "attempt": str(attempt)},
        parent=record.mlflow_run_id,
        start_time=started_at,
    )
    provisioned.tracker.log_params(
        child,
        {
            "attempt": attempt,
            "world_size": spec.world_size,
            "resumed_from_step": resumed_from_step,
            **attempt_degrees(spec, spec.world_size),
        },
    )
    return child


def grace_for(outcome: Outcome) -> float:
    """How long an attempt's processes get between SIGTERM and SIGKILL when it is released."""
    return UNRESPONSIVE_GRACE_S if outcome in UNRESPONSIVE else STOP_GRACE_S


def attempt_degrees(spec: RunSpec, world_size: int) -> dict[str, int]:
    """The degrees this attempt ran with: the data degree follows its world size."""
    p = spec.parallel
    return {"dp_degree": world_size // (p.tensor * p.pipeline), "tp_degree": p.tensor, "pp_degree": p.pipeline}


def _classify_run_name() -> str:
    return f"classify-attempt-{len(task_run.parameters['results'])}"


@lifecycle_task(name="classify-outcome", task_run_name=_classify_run_name)
def classify_outcome(launched: Launched, results: list[AttemptResult]) -> Decision | State:
    """Retry branch or finish, by the attempt's fault-tolerance policy: retryable outcome, budget
    left, and not a crash loop (`results`: every attempt's so far, this one last). After a failed
    attempt the task's state is named after the branch (Recovering, Gave up)."""
    policy = launched.spec.fault_tolerance
    decision = decide_by_rule(policy, results) or decide(policy, results)  # a rule's action comes first
    get_run_logger().info("%s: %s", "retry" if decision.retry else "finish", decision.reason)
    return decided(decision, results[-1])


@lifecycle_task(name="recover-nodes", task_run_name="recover-nodes-{launched.handle.attempt}")
def recover_nodes(launched: Launched, result: AttemptResult) -> RunSpec:
    """The next attempt's spec: replace the node this attempt lost (or a rule's exclude_node named);
    if it cannot come back and min_nodes allows, go on without it. Always a spec object of its own
    (a copy when nothing changed): Prefect links by object identity, and the run's spec is validate-spec's."""
    spec, provisioned, handle = launched.spec, launched.provisioned, launched.handle
    if result.outcome.value == "RESIZED":
        return grown_back(spec, launched.record.spec, provisioned.allocation)
    silent = result.evidence.silent_node
    node = silent.node if silent is not None and result.outcome.value == "NODE_LOST" else excluded_node(result)
    if node is None:
        return spec.model_copy()
    logger = get_run_logger()
    slot = handle.slots[node] if handle.slots else node
    launcher = provisioned.launcher
    if isinstance(launcher, ReplacesNodes) and launcher.replace_node(provisioned.allocation, slot):
        logger.info("node %d replaced for the next attempt", node)
        return spec.model_copy()
    minimum = spec.resources.min_nodes or spec.resources.nodes
    if spec.resources.nodes - 1 < minimum:
        logger.warning("node %d cannot come back and min_nodes is %d: retrying with all nodes", node, minimum)
        return spec.model_copy()
    if slot in provisioned.allocation.slots:
        provisioned.allocation.slots.remove(slot)
        provisioned.allocation.left_out.append(slot)
    smaller = spec.with_nodes(spec.resources.nodes - 1)
    logger.warning(
        "node %d excluded: continuing on %d node(s), world size %d", node, smaller.resources.nodes, smaller.world_size
    )
    return smaller


def grown_back(spec: RunSpec, run_spec: RunSpec, allocation: Allocation) -> RunSpec:
    """The spec of the attempt after a RESIZED one: the slots a shrink left out are back in, in order,
    and at the run's own size the run's own spec (its layout as the user wrote it)."""
    back = allocation.left_out
    allocation.slots = sorted(allocation.slots + back)
    allocation.left_out = []
    nodes = spec.resources.nodes + len(back)
    larger = run_spec.model_copy() if nodes == run_spec.resources.nodes else spec.with_nodes(nodes)
    get_run_logger().warning(
        "node slot(s) %s back: growing to %d node(s), world size %d",
        ", ".join(str(s) for s in back),
        larger.resources.nodes,
        larger.world_size,
    )
    return larger
