"""Before a run is provisioned on a cluster: its namespace, quotas, Secrets and workload API are
there, its Kueue queue is chosen, and worker pods can reach the orchestrator's status channel."""

from __future__ import annotations

import os

from trainflow.backends.kubernetes.cluster import Cluster
from trainflow.backends.kubernetes.config import LaunchApi, kubernetes_config
from trainflow.backends.kubernetes.kueue import KueueChoice, KueueError, choose_queue
from trainflow.backends.kubernetes.quota import attempt_request, quota_problems
from trainflow.backends.kubernetes.workloads import workload_api
from trainflow.runspec import RunSpec

STATUS_HOST_ENV = "TRAINFLOW_STATUS_HOST"


class ProvisionError(RuntimeError):
    """The cluster cannot run this job as specified; the message says what to change."""


def status_host_for(spec: RunSpec) -> str:
    host = kubernetes_config(spec).status_host or os.environ.get(STATUS_HOST_ENV)
    if not host:
        raise ProvisionError(
            "kubernetes.status_host: worker pods must reach the orchestrator's status channel; set it, or "
            f"{STATUS_HOST_ENV} (infra/prefect/base-job-template.json sets it to the flow pod's IP)"
        )
    return host


def check_cluster_fits(cluster: Cluster, spec: RunSpec) -> KueueChoice:
    k8s = kubernetes_config(spec)
    namespace = k8s.namespace
    if cluster.namespace_exists(namespace) is False:
        raise ProvisionError(
            f"kubernetes.namespace: {namespace!r} does not exist; create it "
            f"(kubectl create namespace {namespace}) and apply infra/rbac.yaml there"
        )
    problems = quota_problems(cluster.list("v1", "ResourceQuota", namespace, ""), attempt_request(spec))
    if problems:
        raise ProvisionError(
            f"resources: {spec.resources.nodes} node(s) do not fit the quota of namespace {namespace}: "
            + "; ".join(problems)
            + " (use fewer or smaller nodes, or another namespace)"
        )
    for field_name, secret in (("s3_secret", k8s.s3_secret), ("registry_secret", k8s.registry_secret)):
        if secret and cluster.get("v1", "Secret", namespace, secret) is None:
            raise ProvisionError(
                f"kubernetes.{field_name}: Secret {namespace}/{secret} not found; create it first "
                "(kubectl create secret ..., as in infra/README.md)"
            )
    api_version, kind = workload_api(k8s.launch_api)
    if k8s.launch_api != LaunchApi.indexed_job and not cluster.has_api(api_version, kind):
        raise ProvisionError(
            f"kubernetes.launch_api: {k8s.launch_api.value} needs the {kind} API ({api_version}), which this "
            "cluster does not serve; install it or use launch_api: indexed-job"
        )
    try:
        return choose_queue(cluster, spec)
    except KueueError as exc:
        raise ProvisionError(str(exc)) from None
