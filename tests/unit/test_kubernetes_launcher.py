"""The Kubernetes launcher against an in-memory cluster: provision checks and their messages, the
image (pinned, found, built by Kaniko), launch, poll, stop and release; and every API call it
makes held against the least-privilege Role in infra/rbac.yaml (and every rule there used)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.kubernetes import pod_statuses as s
from tests.kubernetes.fake_cluster import KUEUE_V1BETA2, FakeCluster
from trainflow.backends import launcher_for
from trainflow.backends.base import AttemptPlan
from trainflow.backends.kubernetes.classify import PodExit, pod_outcome
from trainflow.backends.kubernetes.cluster import ClusterError
from trainflow.backends.kubernetes.image import ImageError
from trainflow.backends.kubernetes.launcher import KubernetesLauncher, LaunchError, ProvisionError
from trainflow.backends.kubernetes.registry import RegistryError
from trainflow.contracts import Outcome
from trainflow.runspec import load_spec

EXAMPLE = ROOT / "examples" / "specs" / "digits-kubernetes.yaml"
JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")
PYTORCHJOB = ("kubeflow.org/v1", "PyTorchJob")
DIGEST = "sha256:" + "cd" * 32
RUN_ID = "digits-k8s-20250601-100000-abc123"


class Objects:
    """Stands in for S3: what the launcher uploaded and deleted."""

    def __init__(self):
        self.put_uris: list[str] = []
        self.deleted: list[str] = []

    def put(self, uri: str, data: bytes) -> None:
        assert data[:2] == b"\x1f\x8b"  # gzip
        self.put_uris.append(uri)

    def delete(self, uri: str) -> None:
        self.deleted.append(uri)


def spec_for(*overrides: str):
    return load_spec(
        EXAMPLE,
        ["kubernetes.status_host=10.8.0.4", "kubernetes.image=registry.example.com/ml/trainflow:v1", *overrides],
    )


def worker_config_secrets(cluster: FakeCluster) -> list[dict]:
    """The attempts' Secrets of worker configs (not the user's Secrets the spec names)."""
    return [doc for doc in cluster.of_kind("Secret") if doc["metadata"]["name"].endswith("-config")]


def secrets(cluster: FakeCluster, *names: str) -> None:
    for name in names:
        cluster.add({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "trainflow"}})


def launcher_on(cluster: FakeCluster, registry=lambda repo, tag: DIGEST, **kw) -> KubernetesLauncher:
    kw.setdefault("sleep", lambda seconds: None)
    return KubernetesLauncher(cluster, poll_interval_s=0.0, delete_timeout_s=0.0, registry=registry, **kw)


def plan(attempt: int = 1, address: str = "0.0.0.0:41234") -> AttemptPlan:
    return AttemptPlan(attempt, address, "token", "abc123", None)


@pytest.fixture
def cluster() -> FakeCluster:
    fake = FakeCluster(crds=[JOBSET, PYTORCHJOB, KUEUE_V1BETA2])
    secrets(fake, "trainflow-s3")
    return fake


# a whole attempt --------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["indexed-job", "jobset", "pytorchjob"])
def test_an_attempt_from_provision_to_release(cluster, tmp_path, api):
    spec = spec_for(f"kubernetes.launch_api={api}", "resources.nodes=3")
    launcher = launcher_on(cluster)
    allocation = launcher.provision(spec, RUN_ID, tmp_path / "run")
    assert [svc["metadata"]["name"] for svc in cluster.of_kind("Service")] == [allocation.service]
    assert allocation.status_host == "10.8.0.4" and allocation.slots == [0, 1, 2]

    handle = launcher.launch(spec, allocation, plan())
    assert allocation.image == {
        "reference": f"registry.example.com/ml/trainflow@{DIGEST}",
        "repository": "registry.example.com/ml/trainflow",
        "tag": "v1",
        "digest": DIGEST,
        "built": False,
    }
    assert not cluster.of_kind("ConfigMap")  # the configs hold the status token: a Secret
    [config] = worker_config_secrets(cluster)
    assert '"status_address": "10.8.0.4:41234"' in config["stringData"][sorted(config["stringData"])[0]]
    assert [e.running for e in launcher.poll(handle)] == [True, True, True]  # no pods yet

    cluster.run_workload(lambda node: s.running(node)["status"])
    assert [e.running for e in launcher.poll(handle)] == [True, True, True]
    assert launcher.probe(handle, 1) == "running"

    cluster.set_pod_status(2, s.oom_killed(2)["status"])
    exits = launcher.poll(handle)
    assert [e.running for e in exits] == [True, True, False]
    assert isinstance(exits[2], PodExit) and exits[2].returncode == 137
    assert pod_outcome(exits)[0] == Outcome.USER_ERROR and launcher.probe(handle, 2) == "gone"

    cluster.logs = {
        pod["metadata"]["name"]: f"rank output of {pod['metadata']['name']}\n" for pod in cluster.of_kind("Pod")
    }
    stopped = launcher.stop(handle, grace_s=30)
    assert stopped == 3 and not cluster.of_kind("Pod") and not worker_config_secrets(cluster)
    assert all(grace == 30 for kind, _, grace in cluster.deleted if kind == "Pod")
    assert all(handle.logs[node].read_text().startswith("rank output of") for node in range(3))

    report = launcher.release(allocation)
    assert report.clean, report.survivors
    assert f"Service/{allocation.service}" in report.deleted_objects
    assert not cluster.objects.keys() - {("Secret", "trainflow", "trainflow-s3")}
    assert not (tmp_path / "run").exists() and report.as_dict()["deleted_objects"]


def test_launcher_is_registered_for_the_kubernetes_backend():
    assert isinstance(launcher_for(spec_for()), KubernetesLauncher)


def test_poll_asks_the_api_server_at_most_once_per_interval(cluster, tmp_path):
    spec = spec_for()
    launcher = KubernetesLauncher(cluster, poll_interval_s=3600.0, registry=lambda repo, tag: DIGEST)
    handle = launcher.launch(spec, launcher.provision(spec, RUN_ID, tmp_path), plan())
    before = len(cluster.calls)
    for _ in range(20):
        launcher.poll(handle)
    assert len(cluster.calls) - before == 2  # one list of pods, one of Jobs


def test_an_api_hiccup_during_poll_keeps_the_last_view(cluster, tmp_path):
    spec = spec_for()
    launcher = launcher_on(cluster)
    handle = launcher.launch(spec, launcher.provision(spec, RUN_ID, tmp_path), plan())
    cluster.run_workload(lambda node: s.running(node)["status"])
    first = launcher.poll(handle)
    cluster.fail_next["list Pod"] = ClusterError("list Pod: connection refused", 503)
    assert launcher.poll(handle) == first
    assert "connection refused" in launcher.describe(handle)["api_errors"][0]


def test_release_reports_what_would_not_go(cluster, tmp_path):
    spec = spec_for()
    launcher = launcher_on(cluster)
    allocation = launcher.provision(spec, RUN_ID, tmp_path)
    stuck = cluster.delete
    cluster.delete = lambda api_version, kind, ns, name, grace_s=None: (
        kind != "Service" and stuck(api_version, kind, ns, name, grace_s)
    )
    report = launcher.release(allocation)
    assert not report.clean
    assert report.survivors == [f"Service/{allocation.service} still in namespace trainflow"]


# provision: what is checked, and the messages ---------------------------------------------------


def provision_error(cluster: FakeCluster, tmp_path: Path, *overrides: str) -> str:
    with pytest.raises(ProvisionError) as info:
        launcher_on(cluster).provision(spec_for(*overrides), RUN_ID, tmp_path)
    return str(info.value)


def test_missing_namespace_says_how_to_create_it(tmp_path):
    message = provision_error(FakeCluster(namespaces=()), tmp_path)
    assert (
        "kubernetes.namespace: 'trainflow' does not exist" in message
        and "kubectl create namespace trainflow" in message
    )


def test_unreadable_namespaces_are_not_an_error(tmp_path):
    cluster = FakeCluster(namespace_readable=False)
    secrets(cluster, "trainflow-s3")
    assert launcher_on(cluster).provision(spec_for(), RUN_ID, tmp_path).namespace == "trainflow"


def test_quota_that_cannot_fit_the_job_names_the_numbers(cluster, tmp_path):
    cluster.add(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "team", "namespace": "trainflow"},
            "spec": {"hard": {"requests.cpu": "4", "requests.memory": "8Gi", "pods": "10"}},
            "status": {
                "hard": {"requests.cpu": "4", "requests.memory": "8Gi", "pods": "10"},
                "used": {"requests.cpu": "3500m", "requests.memory": "1Gi", "pods": "1"},
            },
        }
    )
    message = provision_error(cluster, tmp_path, "resources.nodes=2")
    assert "resourcequota/team: requests.cpu needs 2, 0.5 of 4 left" in message
    assert "memory" not in message  # 4Gi needed, 7Gi left


def test_missing_secret_is_named(tmp_path):
    message = provision_error(FakeCluster(), tmp_path)
    assert "kubernetes.s3_secret: Secret trainflow/trainflow-s3 not found" in message


@pytest.mark.parametrize("api, kind", [("jobset", "JobSet"), ("pytorchjob", "PyTorchJob")])
def test_launch_api_without_its_crd_suggests_indexed_job(tmp_path, api, kind):
    cluster = FakeCluster()
    secrets(cluster, "trainflow-s3")
    message = provision_error(cluster, tmp_path, f"kubernetes.launch_api={api}")
    assert f"needs the {kind} API" in message and "launch_api: indexed-job" in message


def test_kueue_queue_without_kueue(tmp_path):
    cluster = FakeCluster()
    secrets(cluster, "trainflow-s3")
    assert "install Kueue or remove kueue_queue" in provision_error(
        cluster, tmp_path, "kubernetes.kueue_queue=training"
    )


def test_no_status_host_says_where_to_set_it(cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINFLOW_STATUS_HOST", raising=False)
    with pytest.raises(ProvisionError, match="kubernetes.status_host: worker pods must reach"):
        launcher_on(cluster).provision(load_spec(EXAMPLE), RUN_ID, tmp_path)
    monkeypatch.setenv("TRAINFLOW_STATUS_HOST", "10.8.0.9")
    assert launcher_on(cluster).provision(load_spec(EXAMPLE), RUN_ID, tmp_path).status_host == "10.8.0.9"


def test_a_status_channel_on_loopback_is_refused_before_any_pod_starts(cluster, tmp_path):
    spec = spec_for()
    launcher = launcher_on(cluster)
    allocation = launcher.provision(spec, RUN_ID, tmp_path)
    with pytest.raises(LaunchError, match="listens on 127.0.0.1, which pods cannot reach"):
        launcher.launch(spec, allocation, plan(address="127.0.0.1:41234"))
    assert not cluster.of_kind("Job") and not worker_config_secrets(cluster)


def test_secret_env_values_go_into_the_attempts_secret_only(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf-value-0123")
    spec = spec_for("workload.secret_env=[HF_TOKEN]")
    launcher = launcher_on(cluster)
    allocation = launcher.provision(spec, RUN_ID, tmp_path / "run")
    launcher.launch(spec, allocation, plan())
    [config] = worker_config_secrets(cluster)
    assert config["stringData"]["env.HF_TOKEN"] == "hf-value-0123"
    assert "hf-value-0123" not in json.dumps([cluster.of_kind("Job"), cluster.of_kind("Service")])
    report = launcher.release(allocation)
    assert report.clean and f"Secret/{config['metadata']['name']}" in report.deleted_objects
    assert not worker_config_secrets(cluster)


def test_failed_workload_create_leaves_no_config_behind(cluster, tmp_path):
    spec = spec_for()
    launcher = launcher_on(cluster)
    allocation = launcher.provision(spec, RUN_ID, tmp_path)
    cluster.fail_next["create Job"] = ClusterError("create Job: forbidden (apply infra/rbac.yaml)", 403)
    with pytest.raises(LaunchError, match="attempt 1 could not start: create Job: forbidden"):
        launcher.launch(spec, allocation, plan())
    assert not worker_config_secrets(cluster)


# the image --------------------------------------------------------------------------------------


def test_pinned_image_missing_from_its_registry_is_an_error(cluster, tmp_path):
    spec = spec_for()
    launcher = launcher_on(cluster, registry=lambda repo, tag: None)
    with pytest.raises(ImageError, match="registry.example.com/ml/trainflow:v1 does not exist"):
        launcher.prepare_image(spec, launcher.provision(spec, RUN_ID, tmp_path))


def test_pinned_image_the_orchestrator_cannot_look_up_is_left_to_the_kubelet(cluster, tmp_path):
    def unreachable(repo, tag):
        raise RegistryError("unauthorized")

    spec = spec_for()
    launcher = launcher_on(cluster, registry=unreachable)
    image = launcher.prepare_image(spec, launcher.provision(spec, RUN_ID, tmp_path))
    assert image["reference"] == "registry.example.com/ml/trainflow:v1" and image["digest"] is None


def kaniko_pod(job_name: str, state: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job_name}-b7x",
            "namespace": "trainflow",
            "creationTimestamp": s.STARTED,
            "labels": {"trainflow.dev/run": RUN_ID, "trainflow.dev/component": "image-build"},
        },
        "status": {
            "phase": "Succeeded" if "terminated" in state else "Running",
            "containerStatuses": [{"name": "kaniko", "state": state}],
        },
    }


def test_missing_derived_image_is_built_in_the_cluster(cluster, tmp_path):
    spec = spec_for(
        "kubernetes.image=registry.example.com/ml/trainflow", "kubernetes.registry_secret=trainflow-registry"
    )
    secrets(cluster, "trainflow-registry")
    objects = Objects()
    polls = []

    def builder_progress(seconds):
        polls.append(seconds)
        [job] = [
            j for j in cluster.of_kind("Job") if j["metadata"]["labels"]["trainflow.dev/component"] == "image-build"
        ]
        state = (
            {"terminated": {"exitCode": 0, "reason": "Completed", "message": DIGEST + "\n"}}
            if len(polls) > 1
            else {"running": {}}
        )
        cluster.add(kaniko_pod(job["metadata"]["name"], state))

    launcher = launcher_on(cluster, registry=lambda repo, tag: None, objects=objects, sleep=builder_progress)
    allocation = launcher.provision(spec, RUN_ID, tmp_path)
    image = launcher.prepare_image(spec, allocation)
    assert image["built"] and image["digest"] == DIGEST and image["tag"].startswith("tf-cpu-")
    assert image["reference"] == f"registry.example.com/ml/trainflow@{DIGEST}"
    assert objects.put_uris == [f"s3://trainflow-checkpoints/_trainflow/build/{image['tag']}.tar.gz"] == objects.deleted
    assert not [j for j in cluster.of_kind("Job")]  # the build Job is deleted once it reported


def test_failed_build_shows_the_end_of_its_log(cluster, tmp_path):
    spec = spec_for("kubernetes.image=registry.example.com/ml/trainflow")

    def fails(seconds):
        [job] = cluster.of_kind("Job")
        pod = kaniko_pod(job["metadata"]["name"], {"terminated": {"exitCode": 1, "reason": "Error"}})
        cluster.logs[pod["metadata"]["name"]] = "error building image: RUN pip install: exit status 1\n"
        cluster.add(pod)

    launcher = launcher_on(cluster, registry=lambda repo, tag: None, objects=Objects(), sleep=fails)
    with pytest.raises(ImageError, match="(?s)build of .* failed: exited with code 1.*RUN pip install"):
        launcher.prepare_image(spec, launcher.provision(spec, RUN_ID, tmp_path))
    assert not cluster.of_kind("Job")


# least privilege ----------------------------------------------------------------------------------


def role_rules() -> list[dict]:
    [role] = [d for d in yaml.safe_load_all((ROOT / "infra" / "rbac.yaml").read_text()) if d["kind"] == "Role"]
    return role["rules"]


def permitted(verb: str, group: str, resource: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in role_rules())


def test_the_role_allows_every_call_the_backend_makes_and_nothing_more(tmp_path):
    calls: set[tuple[str, str, str]] = set()
    for api in ("indexed-job", "jobset", "pytorchjob"):
        cluster = FakeCluster(crds=[JOBSET, PYTORCHJOB, KUEUE_V1BETA2])
        secrets(cluster, "trainflow-s3", "trainflow-registry")
        cluster.add({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "trainflow"}})
        cluster.add_local_queue("training")
        spec = spec_for(
            f"kubernetes.launch_api={api}",
            "kubernetes.image=registry.example.com/ml/trainflow",
            "kubernetes.registry_secret=trainflow-registry",
            "kubernetes.kueue_queue=training",
        )

        def build_succeeds(seconds, cluster=cluster):
            [job] = cluster.of_kind("Job")
            cluster.add(kaniko_pod(job["metadata"]["name"], {"terminated": {"exitCode": 0, "message": DIGEST}}))

        launcher = launcher_on(cluster, registry=lambda repo, tag: None, objects=Objects(), sleep=build_succeeds)
        allocation = launcher.provision(spec, RUN_ID, tmp_path / api)
        handle = launcher.launch(spec, allocation, plan())
        cluster.run_workload(lambda node: s.running(node)["status"])
        launcher.poll(handle)
        launcher.stop(handle, 5)
        assert launcher.release(allocation).clean
        calls |= set(cluster.calls)
    namespace_check = ("get", "", "namespaces")
    assert namespace_check in calls and not permitted(*namespace_check)  # cluster-scoped: tolerated when denied
    denied = sorted(c for c in calls - {namespace_check} if not permitted(*c))
    assert not denied, f"the backend calls what infra/rbac.yaml does not allow: {denied}"
    granted = {
        (verb, group, resource)
        for r in role_rules()
        for group in r["apiGroups"]
        for resource in r["resources"]
        for verb in r["verbs"]
    }
    assert not granted - calls, f"infra/rbac.yaml allows what the backend never calls: {sorted(granted - calls)}"


def test_objects_are_owned_by_the_orchestrator_pod_in_the_same_namespace(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_POD_NAME", "digits-nightly-x2b")
    monkeypatch.setenv("TRAINFLOW_POD_UID", "7c1e")
    monkeypatch.setenv("TRAINFLOW_POD_NAMESPACE", "trainflow")
    spec = spec_for()
    launcher = launcher_on(cluster)
    launcher.launch(spec, launcher.provision(spec, RUN_ID, tmp_path), plan())
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": "digits-nightly-x2b", "uid": "7c1e"}]
    for kind in ("Service", "Job"):
        assert [doc["metadata"]["ownerReferences"] for doc in cluster.of_kind(kind)] == [owner]
    assert [doc["metadata"]["ownerReferences"] for doc in worker_config_secrets(cluster)] == [owner]


def test_an_orchestrator_in_another_namespace_owns_nothing(cluster, tmp_path, monkeypatch):
    # a cross-namespace owner counts as absent, and the garbage collector would delete the job at once
    monkeypatch.setenv("TRAINFLOW_POD_NAME", "digits-nightly-x2b")
    monkeypatch.setenv("TRAINFLOW_POD_UID", "7c1e")
    monkeypatch.setenv("TRAINFLOW_POD_NAMESPACE", "prefect")
    spec = spec_for()
    launcher = launcher_on(cluster)
    launcher.provision(spec, RUN_ID, tmp_path)
    assert "ownerReferences" not in cluster.of_kind("Service")[0]["metadata"]
