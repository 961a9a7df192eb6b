"""Pod statuses (in the API's documented shapes) read as trainflow outcomes, and the attempt-level
view over time: pull errors with patience, pods that vanish, Jobs failed by their policy."""

from __future__ import annotations

import pytest

from tests.kubernetes import pod_statuses as s
from trainflow.backends.kubernetes.classify import (
    FAILURE_RULES,
    NEVER_STARTED,
    VANISHED,
    PodExit,
    classify_job_failure,
    classify_pod,
    job_waiting,
    node_index,
    pod_outcome,
)
from trainflow.backends.kubernetes.observe import PodObserver
from trainflow.contracts import Outcome
from trainflow.runtime import exit_codes


def test_running_pod_is_running():
    verdict = classify_pod(s.running(2))
    assert (verdict.node, verdict.ended, verdict.outcome, verdict.reason) == (2, False, None, "running")


def test_completed_pod_ended_with_zero_and_no_verdict_of_its_own():
    verdict = classify_pod(s.succeeded())
    assert verdict.ended and verdict.exit_code == 0 and verdict.outcome is None


def test_oom_killed_is_a_user_error_that_says_what_to_change():
    verdict = classify_pod(s.oom_killed(1), memory_limit="2Gi")
    assert verdict.ended and verdict.exit_code == 137
    assert verdict.outcome == Outcome.USER_ERROR
    assert "OOMKilled" in verdict.reason and "2Gi" in verdict.reason and "resources.memory" in verdict.reason


def test_evicted_under_node_pressure_is_infra():
    verdict = classify_pod(s.evicted())
    assert verdict.ended and verdict.outcome == Outcome.INFRA
    assert "evicted" in verdict.reason and "low on resource: memory" in verdict.reason


@pytest.mark.parametrize(
    "reason, outcome",
    [
        ("PreemptionByScheduler", Outcome.PREEMPTED),
        ("EvictionByEvictionAPI", Outcome.PREEMPTED),
        ("DeletionByTaintManager", Outcome.NODE_LOST),
        ("DeletionByPodGC", Outcome.NODE_LOST),
    ],
)
def test_disruption_target_condition_names_the_outcome(reason, outcome):
    verdict = classify_pod(s.disrupted(reason=reason))
    assert verdict.ended and verdict.exit_code == 143 and verdict.outcome == outcome


def test_preempted_pod_still_in_its_grace_period_is_not_over_yet_but_marked():
    verdict = classify_pod(s.disrupted(reason="PreemptionByScheduler", ended=False))
    assert not verdict.ended and verdict.outcome == Outcome.PREEMPTED
    assert "higher-priority" in verdict.reason


@pytest.mark.parametrize("message", [s.PULL_NOT_FOUND, s.PULL_DENIED])
def test_image_pull_of_a_wrong_reference_fails_at_once_as_user_error(message):
    verdict = classify_pod(s.image_pull_error(message=message))
    assert verdict.ended and not verdict.stuck and verdict.outcome == Outcome.USER_ERROR
    assert "kubernetes.image" in verdict.reason and "ErrImagePull" in verdict.reason


@pytest.mark.parametrize("pod", [s.image_pull_error(message=s.PULL_TIMEOUT), s.image_pull_backoff()])
def test_image_pull_that_may_clear_is_infra_and_gets_time(pod):
    verdict = classify_pod(pod)
    assert not verdict.ended and verdict.stuck and verdict.outcome == Outcome.INFRA


def test_missing_secret_is_a_user_error_naming_the_field():
    verdict = classify_pod(s.config_error())
    assert verdict.ended and verdict.outcome == Outcome.USER_ERROR
    assert "kubernetes.s3_secret" in verdict.reason and 'secret "trainflow-s3" not found' in verdict.reason


def test_nonzero_exit_is_left_to_the_workers_reports():
    verdict = classify_pod(s.exited(code=1))
    assert verdict.ended and verdict.exit_code == 1 and verdict.outcome is None
    assert "exited with code 1" in verdict.reason


def test_exit_by_signal_is_named():
    assert "SIGKILL" in classify_pod(s.exited(code=137)).reason


def test_container_that_could_not_start_is_a_user_error():
    pod = s.exited(code=128, reason="StartError", message='exec: "python": executable file not found in $PATH')
    verdict = classify_pod(pod)
    assert verdict.outcome == Outcome.USER_ERROR and "executable file not found" in verdict.reason


def test_unschedulable_pod_waits_and_says_why():
    verdict = classify_pod(s.unschedulable())
    assert not verdict.ended and not verdict.stuck
    assert "Insufficient nvidia.com/gpu" in verdict.reason


def test_phase_unknown_is_a_lost_node():
    verdict = classify_pod(s.node_unknown())
    assert verdict.ended and verdict.outcome == Outcome.NODE_LOST


def test_node_index_from_completion_index_and_pytorchjob_replicas():
    assert node_index(s.running(3)) == 3
    master = {
        "metadata": {
            "labels": {"training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}
        }
    }
    worker = {
        "metadata": {
            "labels": {"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "2"}
        }
    }
    assert (node_index(master), node_index(worker)) == (0, 3)


def test_pod_failure_policy_rules_and_classification_share_one_table():
    by_name = {rule.name: rule for rule in FAILURE_RULES}
    assert by_name["orchestrator-lost"].exit_codes == (exit_codes.ORCHESTRATOR_LOST,)
    assert by_name["preempted"].exit_codes == (exit_codes.PREEMPTED,)
    index = FAILURE_RULES.index(by_name["orchestrator-lost"])
    outcome, message = classify_job_failure(s.failed_by_policy(index, exit_codes.ORCHESTRATOR_LOST))
    assert outcome == Outcome.INFRA and "exit code 75" in message


def test_job_failed_otherwise_leaves_the_outcome_to_the_pods():
    job = s.job(failed={"reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"})
    assert classify_job_failure(job) == (None, "BackoffLimitExceeded: Job has reached the specified backoff limit")
    assert classify_job_failure(s.job()) is None


def test_suspended_job_is_waiting_for_admission():
    assert "admission" in job_waiting(s.job(suspended=True))
    assert job_waiting(s.job()) is None


# the attempt over time ----------------------------------------------------------------------------


def observer(nodes: int = 2, patience: float = 60.0) -> PodObserver:
    return PodObserver(nodes, "trainer", "2Gi", pull_patience_s=patience)


def test_observer_reports_every_node_running_or_not_yet_there():
    exits = observer(3).update([s.running(0), s.running(1)], [], now=0.0)
    assert [e.running for e in exits] == [True, True, True]
    assert exits[2].reason == "no pod yet"


def test_observer_ends_a_node_on_oom_with_the_pod_as_evidence():
    exits = observer().update([s.running(0), s.oom_killed(1)], [], now=0.0)
    assert exits[0].running and exits[1].returncode == 137 and exits[1].outcome == Outcome.USER_ERROR
    assert pod_outcome(exits) == (Outcome.USER_ERROR, f"node 1 ({exits[1].pod}): {exits[1].reason}")


def test_plain_crash_leaves_the_decision_to_the_workers():
    exits = observer().update([s.running(0), s.exited(1, code=1)], [], now=0.0)
    assert exits[1].returncode == 1 and pod_outcome(exits) is None


def test_transient_pull_error_ends_the_node_only_after_its_patience():
    watch = observer(1, patience=60.0)
    assert watch.update([s.image_pull_backoff(0)], [], now=0.0)[0].running
    assert watch.update([s.image_pull_backoff(0)], [], now=59.0)[0].running
    late = watch.update([s.image_pull_backoff(0)], [], now=61.0)[0]
    assert late.returncode == NEVER_STARTED and late.outcome == Outcome.INFRA and "for 61s" in late.reason


def test_pull_error_that_clears_resets_the_patience():
    watch = observer(1, patience=60.0)
    watch.update([s.image_pull_backoff(0)], [], now=0.0)
    watch.update([s.running(0)], [], now=30.0)
    assert watch.update([s.image_pull_backoff(0)], [], now=70.0)[0].running


def test_pod_that_vanishes_while_running_is_a_lost_node():
    watch = observer(1)
    watch.update([s.running(0)], [], now=0.0)
    gone = watch.update([], [], now=1.0)[0]
    assert gone.returncode == VANISHED and gone.outcome == Outcome.NODE_LOST


def test_pod_deleted_by_the_taint_manager_keeps_its_disruption_reason():
    watch = observer(1)
    watch.update([s.disrupted(0, reason="DeletionByTaintManager", ended=False)], [], now=0.0)
    gone = watch.update([], [], now=1.0)[0]
    assert gone.outcome == Outcome.NODE_LOST and "NoExecute" in gone.reason


def test_pods_deleted_because_the_job_failed_are_symptoms_not_causes():
    watch = observer(2)
    watch.update([s.running(0), s.running(1)], [], now=0.0)
    exits = watch.update([s.oom_killed(1)], [s.failed_by_policy(4, 137)], now=1.0)
    assert exits[0].returncode == VANISHED and exits[0].outcome is None
    assert pod_outcome(exits)[0] == Outcome.USER_ERROR


def test_suspended_job_says_so_for_nodes_without_pods():
    watch = observer(1)
    exits = watch.update([], [s.job(suspended=True)], now=0.0)
    assert exits[0].running and "admission" in exits[0].reason and watch.waiting


def test_pod_exit_is_a_node_exit_for_the_existing_classifier():
    exit_ = PodExit(0, 1, None, "exited with code 1", "p")
    assert not exit_.running and exit_.returncode == 1
