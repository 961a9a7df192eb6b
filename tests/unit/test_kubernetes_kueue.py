"""Kueue on the in-memory cluster: v1beta2 asked for first, v1beta1 only when it is all the cluster
serves, neither a clear error for a named queue and plain Jobs otherwise; the team's LocalQueue
when the spec names none."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.kubernetes.fake_cluster import KUEUE_V1BETA1, KUEUE_V1BETA2, FakeCluster
from trainflow.backends.base import AttemptPlan
from trainflow.backends.kubernetes.kueue import KueueChoice, choose_queue
from trainflow.backends.kubernetes.launcher import KubernetesLauncher, ProvisionError
from trainflow.runspec import load_spec

EXAMPLE = ROOT / "examples" / "specs" / "digits-kubernetes.yaml"
DIGEST = "sha256:" + "cd" * 32
RUN_ID = "digits-k8s-20250601-100000-abc123"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def spec_for(*overrides: str):
    return load_spec(
        EXAMPLE,
        ["kubernetes.status_host=10.8.0.4", "kubernetes.image=registry.example.com/ml/trainflow:v1", *overrides],
    )


def cluster_serving(*kueue_apis) -> FakeCluster:
    cluster = FakeCluster(crds=kueue_apis)
    cluster.add({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "trainflow-s3", "namespace": "trainflow"}})
    return cluster


def launched_job(cluster: FakeCluster, spec, tmp_path) -> tuple[KueueChoice, dict]:
    """(the Kueue choice the allocation holds, the attempt's Job) after provision and launch."""
    launcher = KubernetesLauncher(
        cluster, poll_interval_s=0.0, delete_timeout_s=0.0, registry=lambda repo, tag: DIGEST, sleep=lambda s: None
    )
    allocation = launcher.provision(spec, RUN_ID, tmp_path / "run")
    launcher.launch(spec, allocation, AttemptPlan(1, "0.0.0.0:41234", "token", "abc123", None))
    [job] = [
        doc for doc in cluster.of_kind("Job") if doc["metadata"]["labels"].get("trainflow.dev/component") == "workers"
    ]
    return allocation.kueue, job


def kueue_calls(cluster: FakeCluster) -> list[tuple[str, str, str]]:
    return [call for call in cluster.calls if call[2] == "localqueues"]


@pytest.mark.parametrize(
    "served, expected",
    [
        ((KUEUE_V1BETA2, KUEUE_V1BETA1), "kueue.x-k8s.io/v1beta2"),
        ((KUEUE_V1BETA2,), "kueue.x-k8s.io/v1beta2"),
        ((KUEUE_V1BETA1,), "kueue.x-k8s.io/v1beta1"),
    ],
)
def test_the_newest_served_kueue_api_admits_the_named_queue(tmp_path, served, expected):
    cluster = cluster_serving(*served)
    cluster.add_local_queue("training")
    kueue, job = launched_job(cluster, spec_for("kubernetes.kueue_queue=training"), tmp_path)
    assert kueue == KueueChoice(expected, "training", "spec")
    assert job["metadata"]["labels"][QUEUE_LABEL] == "training"
    assert job["spec"]["suspend"] is True  # Kueue admits the whole gang
    assert kueue_calls(cluster) == [("get", "kueue.x-k8s.io", "localqueues")]


def test_a_named_queue_on_a_cluster_without_kueue_is_refused(tmp_path):
    cluster = cluster_serving()
    with pytest.raises(ProvisionError) as info:
        KubernetesLauncher(cluster).provision(spec_for("kubernetes.kueue_queue=training"), RUN_ID, tmp_path)
    assert str(info.value) == (
        "kubernetes.kueue_queue: 'training' needs Kueue (kueue.x-k8s.io/v1beta2 or kueue.x-k8s.io/v1beta1), "
        "which this cluster does not serve; install Kueue or remove kueue_queue"
    )
    assert not cluster.of_kind("Service")  # nothing provisioned


def test_a_named_queue_that_does_not_exist_is_refused(tmp_path):
    cluster = cluster_serving(KUEUE_V1BETA2)
    with pytest.raises(ProvisionError, match=r"^kubernetes.kueue_queue: LocalQueue trainflow/training not found"):
        KubernetesLauncher(cluster).provision(spec_for("kubernetes.kueue_queue=training"), RUN_ID, tmp_path)


@pytest.mark.parametrize("served", [(KUEUE_V1BETA2,), (KUEUE_V1BETA1,)])
def test_without_a_named_queue_the_teams_local_queue_is_used(tmp_path, served):
    cluster = cluster_serving(*served)
    cluster.add_local_queue("vision")
    kueue, job = launched_job(cluster, spec_for("tracking.tags={team: vision}"), tmp_path)
    assert kueue == KueueChoice(served[0][0], "vision", "team")
    assert job["metadata"]["labels"][QUEUE_LABEL] == "vision" and job["spec"]["suspend"] is True


def test_a_team_without_a_local_queue_runs_plain_jobs(tmp_path):
    cluster = cluster_serving(KUEUE_V1BETA2)
    cluster.add_local_queue("speech")
    kueue, job = launched_job(cluster, spec_for("tracking.tags={team: vision}"), tmp_path)
    assert kueue == KueueChoice("kueue.x-k8s.io/v1beta2", None, "none")
    assert QUEUE_LABEL not in job["metadata"]["labels"] and not job["spec"].get("suspend")


def test_no_kueue_and_no_named_queue_runs_plain_jobs_without_asking_for_queues(tmp_path):
    cluster = cluster_serving()
    kueue, job = launched_job(cluster, spec_for("tracking.tags={team: vision}"), tmp_path)
    assert kueue == KueueChoice(None, None, "none")
    assert QUEUE_LABEL not in job["metadata"]["labels"]
    assert kueue_calls(cluster) == []


def test_a_team_name_kubernetes_cannot_hold_is_not_looked_up():
    cluster = cluster_serving(KUEUE_V1BETA2)
    assert choose_queue(cluster, spec_for("tracking.tags={team: ml_infra}")).queue is None
    assert kueue_calls(cluster) == []
