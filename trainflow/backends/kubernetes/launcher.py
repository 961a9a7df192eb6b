"""The Kubernetes launcher: the Launcher protocol on a cluster.

- provision: the namespace exists, the job fits its quotas, the referenced Secrets and APIs are
  there, and the run's headless Service gives worker pods DNS names for rendezvous.
- launch: the worker image (derived tag, built in the cluster when missing), then the attempt's
  Secret of worker configs (and secret_env values) and its workload (Indexed Job, JobSet or PyTorchJob).
- poll: the attempt's pods, read at most once per `poll_interval_s`, as one PodExit per node.
- stop: keep each pod's log, delete the workload and its pods with the grace period, wait.
- release: delete everything labelled with the run, foreground, wait until gone, report leftovers.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainflow.backends import register
from trainflow.backends.abilities import RenderError
from trainflow.backends.base import Allocation, AttemptHandle, AttemptPlan, NodeExit, ReleaseReport
from trainflow.backends.kubernetes.classify import PodExit, node_index
from trainflow.backends.kubernetes.cluster import Cluster, ClusterError, KubeCluster
from trainflow.backends.kubernetes.build import S3Objects, build_in_cluster
from trainflow.backends.kubernetes.config import LaunchApi, kubernetes_config
from trainflow.backends.kubernetes.image import ImageError, planned_image
from trainflow.backends.kubernetes.kueue import KueueChoice, KueueError, choose_queue, with_queue
from trainflow.backends.kubernetes.manifests import attempt_manifests, headless_service
from trainflow.backends.kubernetes.names import RunNames
from trainflow.backends.kubernetes.observe import PodObserver
from trainflow.backends.kubernetes.owner import orchestrator_owner, owned
from trainflow.backends.kubernetes.pod import CONTAINER
from trainflow.backends.kubernetes.quota import attempt_request, quota_problems
from trainflow.backends.kubernetes.registry import RegistryError, manifest_digest
from trainflow.backends.worker import secret_environment
from trainflow.backends.kubernetes.workloads import (
    JOB_API,
    PYTORCH_CONTAINER,
    workload_api,
)
from trainflow.environment import PROJECT_ROOT
from trainflow.private_files import private_folder
from trainflow.spec import RunSpec

STATUS_HOST_ENV = "TRAINFLOW_STATUS_HOST"
LOG_TAIL_LINES = 5000
POD = ("v1", "Pod")
WORKER_CONFIG_SECRET = ("v1", "Secret")
SERVICE = ("v1", "Service")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class ProvisionError(RuntimeError):
    """The cluster cannot run this job as specified; the message says what to change."""


class LaunchError(RuntimeError):
    """An attempt could not be started."""


@dataclass
class KubernetesAttempt(AttemptHandle):
    """An attempt's handle: where its objects are and what was last seen of its pods."""

    namespace: str = ""
    run_id: str = ""
    workload: tuple[str, str, str] = ("", "", "")  # apiVersion, kind, name
    config_secret: str = ""
    observer: PodObserver | None = None
    exits: list[NodeExit] = field(default_factory=list)
    polled_at: float = float("-inf")
    api_errors: list[str] = field(default_factory=list)


@dataclass
class KubernetesReleaseReport(ReleaseReport):
    deleted_objects: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {**super().as_dict(), "deleted_objects": self.deleted_objects}


def status_host_for(spec: RunSpec) -> str:
    host = kubernetes_config(spec).status_host or os.environ.get(STATUS_HOST_ENV)
    if not host:
        raise ProvisionError(
            "kubernetes.status_host: worker pods must reach the orchestrator's status channel; set it, or "
            f"{STATUS_HOST_ENV} (infra/prefect/base-job-template.json sets it to the flow pod's IP)"
        )
    return host


@register("kubernetes")
class KubernetesLauncher:
    name = "kubernetes"
    status_bind_host = "0.0.0.0"  # the status channel must accept connections from pods

    def __init__(
        self,
        cluster: Cluster | None = None,
        *,
        poll_interval_s: float = 1.0,
        pull_patience_s: float = 120.0,
        delete_timeout_s: float = 120.0,
        build_timeout_s: float = 3600.0,
        registry: Callable[[str, str], str | None] = manifest_digest,
        objects: S3Objects | None = None,
        project_root: Path = PROJECT_ROOT,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self._cluster = cluster
        self.poll_interval_s = poll_interval_s
        self.pull_patience_s = pull_patience_s
        self.delete_timeout_s = delete_timeout_s
        self.build_timeout_s = build_timeout_s
        self.registry = registry
        self.objects = objects or S3Objects()
        self.project_root = project_root
        self.sleep = sleep

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = KubeCluster()
        return self._cluster

    # provision ------------------------------------------------------------------------------

    def provision(self, spec: RunSpec, run_id: str, scratch: Path) -> Allocation:
        k8s = kubernetes_config(spec)
        namespace = k8s.namespace
        status_host = status_host_for(spec)
        try:
            kueue = self._check_cluster_fits(spec)
            self.cluster.create(owned(headless_service(spec, run_id), orchestrator_owner(namespace)))
        except ClusterError as exc:
            if exc.status != 409:  # 409: this run's Service exists already (provision retried)
                raise ProvisionError(str(exc)) from None
        private_folder(scratch)
        allocation = Allocation(
            run_id=run_id,
            backend=self.name,
            nodes=spec.resources.nodes,
            scratch=scratch,
            details={"namespace": namespace, "launch_api": k8s.launch_api.value, "service": RunNames(run_id).service,
                     "kueue": kueue.as_dict()},
        )
        allocation.status_host = status_host
        allocation.slots = list(range(spec.resources.nodes))
        return allocation

    def _check_cluster_fits(self, spec: RunSpec) -> KueueChoice:
        k8s = kubernetes_config(spec)
        namespace = k8s.namespace
        if self.cluster.namespace_exists(namespace) is False:
            raise ProvisionError(
                f"kubernetes.namespace: {namespace!r} does not exist; create it "
                f"(kubectl create namespace {namespace}) and apply infra/rbac.yaml there"
            )
        problems = quota_problems(self.cluster.list("v1", "ResourceQuota", namespace, ""), attempt_request(spec))
        if problems:
            raise ProvisionError(
                f"resources: {spec.resources.nodes} node(s) do not fit the quota of namespace {namespace}: "
                + "; ".join(problems) + " (use fewer or smaller nodes, or another namespace)"
            )
        for field_name, secret in (("s3_secret", k8s.s3_secret), ("registry_secret", k8s.registry_secret)):
            if secret and self.cluster.get("v1", "Secret", namespace, secret) is None:
                raise ProvisionError(
                    f"kubernetes.{field_name}: Secret {namespace}/{secret} not found; create it first "
                    "(kubectl create secret ..., as in infra/README.md)"
                )
        api_version, kind = workload_api(k8s.launch_api)
        if k8s.launch_api != LaunchApi.indexed_job and not self.cluster.has_api(api_version, kind):
            raise ProvisionError(
                f"kubernetes.launch_api: {k8s.launch_api.value} needs the {kind} API ({api_version}), which this "
                "cluster does not serve; install it or use launch_api: indexed-job"
            )
        try:
            return choose_queue(self.cluster, spec)
        except KueueError as exc:
            raise ProvisionError(str(exc)) from None

    # render ---------------------------------------------------------------------------------

    def render(self, spec: RunSpec, out_dir: Path, run_id: str | None, attempt: int) -> list[Path]:
        """The attempt's manifests as YAML files, without a cluster."""
        from trainflow.backends.kubernetes.render import render_attempt

        try:
            return render_attempt(spec, out_dir, run_id=run_id, attempt=attempt)
        except ImageError as exc:
            raise RenderError(str(exc)) from exc

    # image ----------------------------------------------------------------------------------

    def prepare_image(self, spec: RunSpec, allocation: Allocation) -> dict:
        """The image the workers run, pinned by digest where the registry says; built in the cluster
        when a derived tag is missing. Recorded in allocation.details["image"] (for MLflow)."""
        if "image" in allocation.details:
            return allocation.details["image"]
        planned = planned_image(spec, self.project_root)
        built = False
        try:
            digest = planned.digest or self.registry(planned.repository, planned.tag)
        except RegistryError as exc:
            if planned.derived:
                raise ImageError(f"kubernetes.image: cannot tell whether {planned.reference} exists: {exc}") from None
            digest = None  # the nodes may have credentials the orchestrator lacks; the kubelet decides
        else:
            if digest is None and not planned.derived:
                raise ImageError(f"kubernetes.image: {planned.reference} does not exist in its registry")
        if digest is None and planned.derived:
            digest = build_in_cluster(
                self.cluster, spec, allocation.run_id, planned, self.objects, self.project_root,
                self.build_timeout_s, self.sleep,
            )
            built = True
        image = planned.with_digest(digest) if digest else planned
        info = {"reference": image.reference, "repository": planned.repository, "tag": planned.tag,
                "digest": digest, "built": built}
        allocation.details["image"] = info
        return info

    # launch ---------------------------------------------------------------------------------

    def launch(self, spec: RunSpec, allocation: Allocation, plan: AttemptPlan) -> AttemptHandle:
        image = self.prepare_image(spec, allocation)["reference"]
        plan = dataclasses.replace(plan, status_address=self.pod_status_address(plan, allocation))
        namespace = kubernetes_config(spec).namespace
        spec = with_queue(spec, allocation.details.get("kueue", {}).get("queue", kubernetes_config(spec).kueue_queue))
        config_secret, workload = attempt_manifests(spec, allocation.run_id, plan, image, secret_environment(spec))
        try:
            owner = orchestrator_owner(namespace)
            self.cluster.create(owned(config_secret, owner))
            # by name: the orchestrator may not list Secrets (that would read every one in the namespace)
            allocation.details.setdefault("config_secrets", []).append(config_secret["metadata"]["name"])
            self.cluster.create(owned(workload, owner))
        except ClusterError as exc:
            self._delete_quietly(WORKER_CONFIG_SECRET, namespace, config_secret["metadata"]["name"])
            raise LaunchError(f"attempt {plan.attempt} could not start: {exc}") from None
        nodes = spec.resources.nodes
        attempt_dir = allocation.scratch / f"attempt-{plan.attempt}"
        private_folder(attempt_dir)
        container = PYTORCH_CONTAINER if kubernetes_config(spec).launch_api == LaunchApi.pytorchjob else CONTAINER
        handle = KubernetesAttempt(
            attempt=plan.attempt,
            nodes=nodes,
            started_at=time.time(),
            logs={node: attempt_dir / f"node-{node}.log" for node in range(nodes)},
            namespace=namespace,
            run_id=allocation.run_id,
            workload=(workload["apiVersion"], workload["kind"], workload["metadata"]["name"]),
            config_secret=config_secret["metadata"]["name"],
            observer=PodObserver(nodes, container, spec.resources.memory, self.pull_patience_s),
            exits=[PodExit(node, None) for node in range(nodes)],
        )
        handle.slots = list(range(nodes))
        return handle

    @staticmethod
    def pod_status_address(plan: AttemptPlan, allocation: Allocation) -> str:
        """The status channel's address as pods must dial it."""
        host, _, port = plan.status_address.rpartition(":")
        if host in LOOPBACK_HOSTS:
            raise LaunchError(
                f"the status channel listens on {host}, which pods cannot reach: open it on "
                f"{getattr(allocation, 'status_host', '0.0.0.0')} (StatusServer(host=...) in the provision task)"
            )
        if host in ("0.0.0.0", "::", ""):
            host = getattr(allocation, "status_host", "")
        return f"{host}:{port}"

    # watch ----------------------------------------------------------------------------------

    def poll(self, handle: KubernetesAttempt) -> list[NodeExit]:
        now = time.monotonic()
        if now - handle.polled_at < self.poll_interval_s:
            return handle.exits  # the watcher polls every 0.1 s; the API server gets one list a second
        handle.polled_at = now
        selector = RunNames(handle.run_id).selector(handle.attempt)
        try:
            pods = self.cluster.list(*POD, handle.namespace, selector)
            jobs = self.cluster.list(*JOB_API, handle.namespace, selector) if handle.workload[1] != "PyTorchJob" else []
        except ClusterError as exc:
            handle.api_errors.append(str(exc))  # a passing API hiccup; heartbeats still tell node health
            return handle.exits
        handle.exits = handle.observer.update(pods, jobs, now)
        return handle.exits

    def describe(self, handle: KubernetesAttempt) -> dict:
        """What each node's pod is doing, as last seen: evidence for startup timeouts and reports."""
        return {
            "waiting": handle.observer.waiting if handle.observer else None,
            "nodes": {e.node: getattr(e, "reason", "") for e in handle.exits},
            "api_errors": handle.api_errors[-3:],
        }

    def probe(self, handle: KubernetesAttempt, node: int) -> str:
        """How a silent node looks from the cluster: its pod running, gone, or unknown."""
        verdict = handle.observer.last.get(node) if handle.observer else None
        if verdict is None or verdict.phase == "Unknown":
            return "unknown"
        exit_ = next((e for e in handle.exits if e.node == node), None)
        if verdict.ended or (exit_ is not None and not exit_.running):
            return "gone"
        return "running" if verdict.phase == "Running" else "unknown"

    def replace_node(self, allocation: Allocation, slot: int) -> bool:
        """The scheduler places the next attempt's pod on any healthy node."""
        return True

    # stop and release -----------------------------------------------------------------------

    def stop(self, handle: KubernetesAttempt, grace_s: float) -> int:
        """Keep each pod's log, then delete the attempt's workload and pods (SIGTERM, SIGKILL after
        `grace_s`) and its worker-config Secret; returns how many pods there were."""
        selector = RunNames(handle.run_id).selector(handle.attempt)
        pods = self._list_quietly(POD, handle.namespace, selector)
        container = handle.observer.container if handle.observer else CONTAINER
        for pod in pods:
            node = node_index(pod)
            if node in handle.logs:
                handle.logs[node].write_text(self._log_tail(handle.namespace, pod, container, LOG_TAIL_LINES))
        api_version, kind, name = handle.workload
        self._delete_quietly((api_version, kind), handle.namespace, name)
        grace = max(0, math.ceil(grace_s))
        for pod in pods:
            self._delete_quietly(POD, handle.namespace, pod["metadata"]["name"], grace)
        self._delete_quietly(WORKER_CONFIG_SECRET, handle.namespace, handle.config_secret)
        self._wait_gone([POD], handle.namespace, selector, grace + self.delete_timeout_s)
        return len(pods)

    def release(self, allocation: Allocation) -> ReleaseReport:
        namespace = allocation.details.get("namespace", "default")
        api = LaunchApi(allocation.details.get("launch_api", LaunchApi.indexed_job.value))
        selector = RunNames(allocation.run_id).selector()
        kinds = [workload_api(api), JOB_API, POD, SERVICE]
        kinds = list(dict.fromkeys(kinds))  # indexed-job's workload is a Job already
        report = KubernetesReleaseReport()
        for kind in kinds:
            for doc in self._list_quietly(kind, namespace, selector, report):
                name = doc["metadata"]["name"]
                if self._delete_quietly(kind, namespace, name, report=report):
                    report.deleted_objects.append(f"{kind[1]}/{name}")
                    if kind == POD:
                        report.stopped_processes += 1
        for name in allocation.details.get("config_secrets", []):
            if self._delete_quietly(WORKER_CONFIG_SECRET, namespace, name, report=report):
                report.deleted_objects.append(f"Secret/{name}")
        for leftover in self._wait_gone(kinds, namespace, selector, self.delete_timeout_s, report):
            report.survivors.append(f"{leftover} still in namespace {namespace}")
        for name in allocation.details.get("config_secrets", []):
            if self._get_quietly(WORKER_CONFIG_SECRET, namespace, name, report) is not None:
                report.survivors.append(f"Secret/{name} still in namespace {namespace}")
        report.remove_folder(allocation.scratch)
        return report

    def _wait_gone(self, kinds, namespace: str, selector: str, timeout_s: float, report=None) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            left = [f"{kind[1]}/{doc['metadata']['name']}" for kind in kinds
                    for doc in self._list_quietly(kind, namespace, selector, report)]
            if not left or time.monotonic() >= deadline:
                return left
            self.sleep(1.0)

    def _list_quietly(self, kind, namespace: str, selector: str, report=None) -> list[dict]:
        try:
            return self.cluster.list(kind[0], kind[1], namespace, selector)
        except ClusterError as exc:
            if report is not None and exc.status != 404 and f"cannot list {kind[1]}: {exc}" not in report.survivors:
                report.survivors.append(f"cannot list {kind[1]}: {exc}")
            return []

    def _get_quietly(self, kind, namespace: str, name: str, report) -> dict | None:
        try:
            return self.cluster.get(kind[0], kind[1], namespace, name)
        except ClusterError as exc:
            report.survivors.append(f"cannot read {kind[1]}/{name}: {exc}")
            return None

    def _delete_quietly(self, kind, namespace: str, name: str, grace_s: int | None = None, report=None) -> bool:
        try:
            return self.cluster.delete(kind[0], kind[1], namespace, name, grace_s)
        except ClusterError as exc:
            if report is not None:
                report.survivors.append(f"{kind[1]}/{name}: {exc}")
            return False

    def _log_tail(self, namespace: str, pod: dict, container: str, lines: int) -> str:
        try:
            return self.cluster.pod_log(namespace, pod["metadata"]["name"], container, lines)
        except ClusterError as exc:
            return f"(log unavailable: {exc})"
