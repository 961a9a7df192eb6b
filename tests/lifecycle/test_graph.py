"""The flow run's graph in Prefect is the lifecycle: each task's inputs (the edges the UI draws)
are exactly the stages whose results it uses, read back from the Prefect API."""

from __future__ import annotations

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from tests.lifecycle.scripted_backend import Act, End
from tests.lifecycle.test_branches import run_flow, summary_of  # noqa: F401, F811 - run_flow is a fixture


def graph_of(flow_run_id: str) -> set[tuple[str, str]]:
    """(upstream task run, task run) for every task input of the flow run's task runs."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    names = {run.id: run.name for run in runs}
    return {
        (names[upstream.id], run.name) for run in runs for inputs in run.task_inputs.values() for upstream in inputs
    }


def attempt_edges(k: int, snapshot_steps: list[int], earlier_results: list[str]) -> set[tuple[str, str]]:
    launch, watch, release = f"launch-attempt-{k}", f"watch-attempt-{k}", f"release-attempt-{k}"
    classify = f"classify-attempt-{k}"
    return {
        ("prepare-image", launch),
        (launch, watch),
        *((launch, f"snapshot-step-{step}") for step in snapshot_steps),
        (launch, release),
        (watch, release),
        (launch, classify),
        *((earlier, classify) for earlier in earlier_results),
        (release, classify),
    }


def test_the_graph_of_a_retried_run_is_the_lifecycle_dag(run_flow):  # noqa: F811  the fixture imported above
    outcome, _, _, _ = run_flow([Act(End.crash, steps=5, node=1, checkpoint_at=3), Act(End.finish, checkpoint_at=6)])
    summary = summary_of(outcome)
    assert [a["outcome"] for a in summary["attempts"]] == ["CRASHED", "SUCCEEDED"]

    expected = {
        ("validate-spec", "start-tracking"),
        ("start-tracking", "wait-for-quota"),
        ("start-tracking", "provision"),
        ("provision", "prepare-image"),
        *attempt_edges(1, [3], []),
        # the retry branch: the next attempt's spec and where it resumes come from the failed one
        ("launch-attempt-1", "recover-nodes-1"),
        ("release-attempt-1", "recover-nodes-1"),
        ("launch-attempt-1", "choose-retry-point-after-attempt-1"),
        ("recover-nodes-1", "launch-attempt-2"),
        *attempt_edges(2, [6], ["release-attempt-1"]),
        ("launch-attempt-2", "finalize"),
        ("release-attempt-1", "finalize"),
        ("release-attempt-2", "finalize"),
        ("classify-attempt-2", "finalize"),
        ("snapshot-step-3", "finalize"),
        ("snapshot-step-6", "finalize"),
        ("validate-spec", "teardown"),
        ("start-tracking", "teardown"),
        ("provision", "teardown"),
        ("launch-attempt-2", "teardown"),
        ("finalize", "teardown"),
    }
    assert graph_of(summary["prefect_flow_run_id"]) == expected


def test_a_failed_attempt_is_failed_in_prefect_and_the_run_that_recovers_is_not(run_flow):  # noqa: F811
    outcome, _, _, _ = run_flow([Act(End.crash, steps=5, node=1, checkpoint_at=3), Act(End.finish, checkpoint_at=6)])
    summary = summary_of(outcome)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(summary["prefect_flow_run_id"])
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    states = {run.name: run.state for run in runs}
    reason = summary["attempts"][0]["reason"]
    assert states["watch-attempt-1"].is_failed()
    assert states["watch-attempt-1"].message == f"CRASHED at step 5: {reason}"
    assert states["classify-attempt-1"].name == "Recovering"
    assert states["classify-attempt-1"].message.startswith(f"CRASHED at step 5: {reason}; ")
    assert states["watch-attempt-2"].is_completed() and states["classify-attempt-2"].name == "Completed"
    assert flow_run.state.is_completed()
    assert (
        flow_run.state.message == f"finished at step {summary['final_step']}; 1 of 2 attempts failed: "
        f"attempt 1 CRASHED at step 5 ({reason})"
    )
