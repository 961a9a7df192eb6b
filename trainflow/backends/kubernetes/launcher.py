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
import time
from collections.abc import Callable
from pathlib import Path

from trainflow.backends import register
from trainflow.backends.abilities import RenderError
from trainflow.backends.base import AttemptHandle, AttemptPlan, NodeExit, ReleaseReport
from trainflow.backends.kubernetes.allocation import KubernetesAllocation, KubernetesAttempt, KubernetesReleaseReport
from trainflow.backends.kubernetes.build import S3Objects, build_in_cluster
from trainflow.backends.kubernetes.classify import NEVER_STARTED, VANISHED, PodExit, node_index
from trainflow.backends.kubernetes.cluster import Cluster, ClusterError, KubeCluster
from trainflow.backends.kubernetes.config import LaunchApi, kubernetes_config
from trainflow.backends.kubernetes.evidence import pod_evidence
from trainflow.backends.kubernetes.fits import ProvisionError, check_cluster_fits, status_host_for
from trainflow.backends.kubernetes.image import ImageError, planned_image
from trainflow.backends.kubernetes.kueue import with_queue
from trainflow.backends.kubernetes.manifests import attempt_manifests, headless_service
from trainflow.backends.kubernetes.names import RunNames
from trainflow.backends.kubernetes.objects import (
    POD,
    SERVICE,
    WORKER_CONFIG_SECRET,
    delete_quietly,
    get_quietly,
    kept_log,
    list_quietly,
    log_tail,
    wait_gone,
)
from trainflow.backends.kubernetes.observe import PodObserver
from trainflow.backends.kubernetes.owner import orchestrator_owner, owned
from trainflow.backends.kubernetes.pod import CONTAINER
from trainflow.backends.kubernetes.registry import RegistryError, manifest_digest
from trainflow.backends.kubernetes.workloads import JOB_API, PYTORCH_CONTAINER, workload_api
from trainflow.backends.worker import secret_environment
from trainflow.private_files import private_folder
from trainflow.repro.environment import PROJECT_ROOT
from trainflow.runspec import RunSpec

__all__ = ["KubernetesLauncher", "LaunchError", "ProvisionError"]

LOG_TAIL_LINES = 5000
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class LaunchError(RuntimeError):
    """An attempt could not be started."""


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

    def provision(self, spec: RunSpec, run_id: str, scratch: Path) -> KubernetesAllocation:
        k8s = kubernetes_config(spec)
        namespace = k8s.namespace
        status_host = status_host_for(spec)
        try:
            kueue = check_cluster_fits(self.cluster, spec)
            self.cluster.create(owned(headless_service(spec, run_id), orchestrator_owner(namespace)))
        except ClusterError as exc:
            if exc.status != 409:  # 409: this run's Service exists already (provision retried)
                raise ProvisionError(str(exc)) from None
        private_folder(scratch)
        return KubernetesAllocation(
            run_id=run_id,
            backend=self.name,
            nodes=spec.resources.nodes,
            scratch=scratch,
            status_host=status_host,
            slots=list(range(spec.resources.nodes)),
            namespace=namespace,
            launch_api=k8s.launch_api,
            service=RunNames(run_id).service,
            kueue=kueue,
        )

    # render ---------------------------------------------------------------------------------

    def render(self, spec: RunSpec, out_dir: Path, run_id: str | None, attempt: int) -> list[Path]:
        """The attempt's manifests as YAML files, without a cluster."""
        from trainflow.backends.kubernetes.render import render_attempt

        try:
            return render_attempt(spec, out_dir, run_id=run_id, attempt=attempt)
        except ImageError as exc:
            raise RenderError(str(exc)) from exc

    # image ----------------------------------------------------------------------------------

    def prepare_image(self, spec: RunSpec, allocation: KubernetesAllocation) -> dict:
        """The image the workers run, pinned by digest where the registry says; built in the cluster
        when a derived tag is missing. Recorded in the allocation (for MLflow)."""
        if allocation.image is not None:
            return allocation.image
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
                self.cluster,
                spec,
                allocation.run_id,
                planned,
                self.objects,
                self.project_root,
                self.build_timeout_s,
                self.sleep,
            )
            built = True
        image = planned.with_digest(digest) if digest else planned
        info = {
            "reference": image.reference,
            "repository": planned.repository,
            "tag": planned.tag,
            "digest": digest,
            "built": built,
        }
        allocation.image = info
        return info

    # launch ---------------------------------------------------------------------------------

    def launch(self, spec: RunSpec, allocation: KubernetesAllocation, plan: AttemptPlan) -> AttemptHandle:
        image = self.prepare_image(spec, allocation)["reference"]
        plan = dataclasses.replace(plan, status_address=self.pod_status_address(plan, allocation))
        namespace = kubernetes_config(spec).namespace
        spec = with_queue(spec, allocation.kueue.queue)
        config_secret, workload = attempt_manifests(spec, allocation.run_id, plan, image, secret_environment(spec))
        try:
            owner = orchestrator_owner(namespace)
            self.cluster.create(owned(config_secret, owner))
            # by name: the orchestrator may not list Secrets (that would read every one in the namespace)
            allocation.config_secrets.append(config_secret["metadata"]["name"])
            self.cluster.create(owned(workload, owner))
        except ClusterError as exc:
            delete_quietly(self.cluster, WORKER_CONFIG_SECRET, namespace, config_secret["metadata"]["name"])
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
            log_max_bytes=int(spec.tracking.max_node_log_mb * 2**20),
            ranks_per_pod=spec.resources.procs_per_node,
        )
        handle.slots = list(range(nodes))
        return handle

    @staticmethod
    def pod_status_address(plan: AttemptPlan, allocation: KubernetesAllocation) -> str:
        """The status channel's address as pods must dial it."""
        host, _, port = plan.status_address.rpartition(":")
        if host in LOOPBACK_HOSTS:
            raise LaunchError(
                f"the status channel listens on {host}, which pods cannot reach: open it on "
                f"{allocation.status_host} (StatusServer(host=...) in the provision task)"
            )
        if host in ("0.0.0.0", "::", ""):
            host = allocation.status_host
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
        handle.exits = [self._with_evidence(handle, exit_) for exit_ in handle.observer.update(pods, jobs, now)]
        return handle.exits

    def _with_evidence(self, handle: KubernetesAttempt, exit_: PodExit) -> PodExit:
        """A pod that failed, with what its log says about its ranks (read once, kept as the node's log)."""
        if exit_.returncode in (None, 0, NEVER_STARTED, VANISHED) or not exit_.pod:
            return exit_
        if exit_.pod not in handle.evidence:
            container = handle.observer.container if handle.observer else CONTAINER
            pod = {"metadata": {"name": exit_.pod}}
            tail = log_tail(self.cluster, handle.namespace, pod, container, LOG_TAIL_LINES)
            handle.logs[exit_.node].write_text(kept_log(tail, LOG_TAIL_LINES, handle.log_max_bytes))
            handle.evidence[exit_.pod] = pod_evidence(handle.logs[exit_.node], handle.ranks_per_pod)
        return dataclasses.replace(exit_, **handle.evidence[exit_.pod])

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

    def replace_node(self, allocation: KubernetesAllocation, slot: int) -> bool:
        """The scheduler places the next attempt's pod on any healthy node."""
        return True

    # stop and release -----------------------------------------------------------------------

    def stop(self, handle: KubernetesAttempt, grace_s: float) -> int:
        """Keep each pod's log, then delete the attempt's workload and pods (SIGTERM, SIGKILL after
        `grace_s`) and its worker-config Secret; returns how many pods there were."""
        selector = RunNames(handle.run_id).selector(handle.attempt)
        pods = list_quietly(self.cluster, POD, handle.namespace, selector)
        container = handle.observer.container if handle.observer else CONTAINER
        for pod in pods:
            node = node_index(pod)
            if node in handle.logs:
                tail = log_tail(self.cluster, handle.namespace, pod, container, LOG_TAIL_LINES)
                handle.logs[node].write_text(kept_log(tail, LOG_TAIL_LINES, handle.log_max_bytes))
        api_version, kind, name = handle.workload
        delete_quietly(self.cluster, (api_version, kind), handle.namespace, name)
        grace = max(0, math.ceil(grace_s))
        for pod in pods:
            delete_quietly(self.cluster, POD, handle.namespace, pod["metadata"]["name"], grace)
        delete_quietly(self.cluster, WORKER_CONFIG_SECRET, handle.namespace, handle.config_secret)
        wait_gone(self.cluster, [POD], handle.namespace, selector, grace + self.delete_timeout_s, self.sleep)
        return len(pods)

    def release(self, allocation: KubernetesAllocation) -> ReleaseReport:
        namespace = allocation.namespace
        selector = RunNames(allocation.run_id).selector()
        kinds = [workload_api(allocation.launch_api), JOB_API, POD, SERVICE]
        kinds = list(dict.fromkeys(kinds))  # indexed-job's workload is a Job already
        report = KubernetesReleaseReport()
        for kind in kinds:
            for doc in list_quietly(self.cluster, kind, namespace, selector, report):
                name = doc["metadata"]["name"]
                if delete_quietly(self.cluster, kind, namespace, name, report=report):
                    report.deleted_objects.append(f"{kind[1]}/{name}")
                    if kind == POD:
                        report.stopped_processes += 1
        for name in allocation.config_secrets:
            if delete_quietly(self.cluster, WORKER_CONFIG_SECRET, namespace, name, report=report):
                report.deleted_objects.append(f"Secret/{name}")
        for leftover in wait_gone(self.cluster, kinds, namespace, selector, self.delete_timeout_s, self.sleep, report):
            report.survivors.append(f"{leftover} still in namespace {namespace}")
        for name in allocation.config_secrets:
            if get_quietly(self.cluster, WORKER_CONFIG_SECRET, namespace, name, report) is not None:
                report.survivors.append(f"Secret/{name} still in namespace {namespace}")
        report.remove_folder(allocation.scratch)
        return report
