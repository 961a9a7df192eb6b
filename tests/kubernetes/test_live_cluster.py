"""Live tests against a real cluster: run when KUBECONFIG points at one, skipped otherwise.

CI validates every manifest offline (tests/unit/test_kubernetes_*.py) but does not run a cluster.
To run these, point KUBECONFIG at a cluster (kind or a real one) where infra/rbac.yaml is applied
to TRAINFLOW_K8S_NAMESPACE (default: trainflow) and the identity may do what the Role allows:

    KUBECONFIG=~/.kube/config .venv/bin/python -m pytest tests/kubernetes -m kubernetes

The whole-lifecycle test needs more: a trainflow image the cluster can pull (TRAINFLOW_K8S_IMAGE),
an S3 bucket both this machine and the pods reach (TRAINFLOW_K8S_CHECKPOINT_URI, credentials in the
Secret TRAINFLOW_K8S_S3_SECRET), and an address of this machine the pods can dial for the status
channel (TRAINFLOW_STATUS_HOST; the provision task must open the channel on it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainflow.backends.base import AttemptPlan
from trainflow.backends.kubernetes.cluster import KubeCluster
from trainflow.backends.kubernetes.launcher import KubernetesLauncher
from trainflow.backends.kubernetes.names import RunNames
from trainflow.backends.kubernetes.registry import RegistryError
from trainflow.contracts import Outcome
from trainflow.runspec import load_spec

KUBECONFIG = os.environ.get("KUBECONFIG", "")
NAMESPACE = os.environ.get("TRAINFLOW_K8S_NAMESPACE", "trainflow")
EXAMPLE = ROOT / "examples" / "specs" / "digits-kubernetes.yaml"

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.skipif(
        not KUBECONFIG or not Path(KUBECONFIG).expanduser().exists(), reason="needs a live cluster: set KUBECONFIG"
    ),
]


def spec_with(*overrides: str):
    return load_spec(
        EXAMPLE,
        [
            f"kubernetes.namespace={NAMESPACE}",
            "kubernetes.s3_secret=null",
            "kubernetes.service_account=null",
            "kubernetes.status_host=10.0.0.1",
            *overrides,
        ],
    )


def labelled_leftovers(cluster: KubeCluster, run_id: str) -> list[str]:
    selector = RunNames(run_id).selector()
    kinds = [("v1", "Pod"), ("v1", "Service"), ("v1", "Secret"), ("batch/v1", "Job")]
    return [
        f"{kind}/{doc['metadata']['name']}"
        for api, kind in kinds
        for doc in cluster.list(api, kind, NAMESPACE, selector)
    ]


def not_looked_up(repository: str, tag: str) -> str:
    raise RegistryError("not looked up in this test")  # a pinned image then goes straight to the kubelet


def test_provision_and_release_leave_nothing(tmp_path):
    cluster = KubeCluster()
    launcher = KubernetesLauncher(cluster)
    run_id = f"live-provision-{int(time.time())}"
    allocation = launcher.provision(spec_with("kubernetes.image=python:3.11-slim"), run_id, tmp_path / "run")
    assert cluster.get("v1", "Service", NAMESPACE, allocation.service) is not None
    report = launcher.release(allocation)
    assert report.clean, report.survivors
    assert labelled_leftovers(cluster, run_id) == []


def test_an_image_that_does_not_exist_is_a_user_error(tmp_path):
    cluster = KubeCluster()
    launcher = KubernetesLauncher(cluster, registry=not_looked_up)
    spec = spec_with("kubernetes.image=docker.io/library/trainflow-image-that-does-not-exist:0", "resources.nodes=1")
    run_id = f"live-pull-{int(time.time())}"
    allocation = launcher.provision(spec, run_id, tmp_path / "run")
    try:
        handle = launcher.launch(spec, allocation, AttemptPlan(1, "0.0.0.0:7070", "token", "live", None))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            [node] = launcher.poll(handle)
            if not node.running:
                break
            time.sleep(1)
        assert not node.running, f"the pull error was not noticed: {node.reason}"
        assert node.outcome == Outcome.USER_ERROR and "kubernetes.image" in node.reason
        launcher.stop(handle, grace_s=1)
    finally:
        report = launcher.release(allocation)
    assert report.clean, report.survivors
    assert labelled_leftovers(cluster, run_id) == []


LIFECYCLE_ENV = (
    "TRAINFLOW_K8S_IMAGE",
    "TRAINFLOW_K8S_CHECKPOINT_URI",
    "TRAINFLOW_K8S_S3_SECRET",
    "TRAINFLOW_STATUS_HOST",
)


@pytest.mark.skipif(not all(os.environ.get(v) for v in LIFECYCLE_ENV), reason=f"needs {', '.join(LIFECYCLE_ENV)}")
def test_the_whole_lifecycle_on_the_cluster(tmp_path):
    env = dict(
        os.environ,
        TRAINFLOW_HOME=str(tmp_path / "home"),
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    command = [
        sys.executable,
        "-m",
        "trainflow.cli",
        "run",
        str(EXAMPLE),
        "--json",
        "--set",
        f"kubernetes.namespace={NAMESPACE}",
        "--set",
        f"kubernetes.image={os.environ['TRAINFLOW_K8S_IMAGE']}",
        "--set",
        f"checkpoint.uri={os.environ['TRAINFLOW_K8S_CHECKPOINT_URI']}",
        "--set",
        f"kubernetes.s3_secret={os.environ['TRAINFLOW_K8S_S3_SECRET']}",
        "--set",
        "kubernetes.service_account=null",
        "--set",
        "workload.steps=60",
        "--set",
        "checkpoint.every_steps=20",
    ]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "succeeded" and summary["final_step"] == 60
    assert summary["teardown"]["clean"], summary["teardown"]
    assert [c["step"] for c in summary["checkpoints"] if c["verified"]]
    assert labelled_leftovers(KubeCluster(), summary["run_id"]) == []
