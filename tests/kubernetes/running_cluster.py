"""A cluster whose worker pods really run: the in-memory API of fake_cluster.py, with the
controllers of the three launch APIs (an Indexed Job, a JobSet, a PyTorchJob) and kubelets that run
each pod on this machine (pod_sandbox.py), one pod per machine of a `NodeNetwork`. What the
launcher reads back (pod statuses, logs, a Job's failure) comes from those processes.

Only what the tests use is played: each pod's name, hostname, labels and DNS names as the
controllers and a headless Service give them (tests/kubernetes/pod_names.py), one container per
pod, secret and emptyDir volumes. Deleting a pod ends it as a kubelet would (SIGTERM, SIGKILL
after its grace period); the pod object stays, terminating, until its processes are gone.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

from tests.kubernetes.fake_cluster import FakeCluster
from tests.kubernetes.pod_names import dns_names, pods_of, suspended
from tests.kubernetes.pod_sandbox import PodSandbox, secret_data
from trainflow.backends.kubernetes.cluster import ClusterError
from trainflow.backends.netns import NodeNetwork

WORKLOADS = ("Job", "JobSet", "PyTorchJob")
BACKOFF_LIMIT = "Job has reached the specified backoff limit"
COMPLETED = "Reached expected number of succeeded pods"


class RunningCluster(FakeCluster):
    def __init__(self, network: NodeNetwork, folder: Path, **kwargs):
        super().__init__(**kwargs)
        self.network = network
        self.folder = folder
        self.sandboxes: dict[str, PodSandbox] = {}  # pod name -> its container on this machine
        self.pods_run: list[dict] = []  # every pod started, as created
        self._stopping: list[threading.Thread] = []
        self._lock = threading.RLock()  # the flow's thread and the watcher's call the API at once

    # the API ------------------------------------------------------------------------------------

    def create(self, doc):
        with self._lock:
            created = super().create(doc)
            labels = doc["metadata"].get("labels") or {}
            if doc["kind"] in WORKLOADS and labels.get("trainflow.dev/component") == "workers":
                if not suspended(doc):
                    self._run_workload(doc)
            return created

    def get(self, api_version, kind, namespace, name):
        with self._lock:
            self._refresh()
            return super().get(api_version, kind, namespace, name)

    def list(self, api_version, kind, namespace, selector):
        with self._lock:
            self._refresh()
            return super().list(api_version, kind, namespace, selector)

    def delete(self, api_version, kind, namespace, name, grace_s=None):
        with self._lock:
            if kind == "Pod":
                self._call("delete", api_version, kind)
                self.deleted.append((kind, name, grace_s))
                return self._delete_pod(namespace, name, grace_s)
            if kind in WORKLOADS:  # foreground: its pods first
                for pod in self.of_kind("Pod"):
                    if (pod["metadata"].get("labels") or {}).get("fake/owner") == f"{kind}/{name}":
                        self._delete_pod(namespace, pod["metadata"]["name"], None)
                self._call("delete", api_version, kind)
                self.deleted.append((kind, name, grace_s))
                return self.objects.pop((kind, namespace, name), None) is not None
            return super().delete(api_version, kind, namespace, name, grace_s)

    def pod_log(self, namespace, name, container, tail_lines):
        self.calls.append(("get", "", "pods/log"))
        with self._lock:
            sandbox = self.sandboxes.get(name)
        if sandbox is None:
            raise ClusterError(f'pods "{name}" not found', 404)
        return sandbox.log_tail(tail_lines)

    # the Job controller and the kubelets ----------------------------------------------------------

    def _run_workload(self, workload: dict) -> None:
        """Each node's pod, as the workload's controller would create it, started on its machine."""
        namespace = workload["metadata"]["namespace"]
        pods = list(pods_of(workload))
        hosts = {name: self.network.node_address(node) for node, pod in pods for name in dns_names(pod, namespace)}
        for node, pod in pods:
            pod["metadata"]["namespace"] = namespace
            pod["metadata"]["labels"]["fake/owner"] = f"{workload['kind']}/{workload['metadata']['name']}"
            sandbox = PodSandbox(
                pod, self.folder / pod["metadata"]["name"], self.network, node, hosts, self._secret_of(namespace)
            )
            sandbox.start()
            pod["metadata"]["creationTimestamp"] = sandbox.started_at
            pod["status"] = sandbox.status()
            self.sandboxes[pod["metadata"]["name"]] = sandbox
            self.pods_run.append(copy.deepcopy(pod))
            self.add(pod)

    def _secret_of(self, namespace: str):
        def lookup(name: str) -> dict[str, str]:
            with self._lock:
                doc = self.objects.get(("Secret", namespace, name))
            if doc is None:
                raise ClusterError(f'secrets "{name}" not found', 404)
            return secret_data(doc)

        return lookup

    def _refresh(self) -> None:
        """Each pod's status from its processes; a Job fails at its first failed pod (backoffLimit 0)."""
        for (kind, _, name), pod in self.objects.items():
            if kind == "Pod" and name in self.sandboxes:
                pod["status"] = self.sandboxes[name].status()
        for (kind, namespace, name), job in self.objects.items():
            if kind != "Job" or job.get("status", {}).get("conditions"):
                continue
            pods = [
                p
                for (k, ns, _), p in self.objects.items()
                if k == "Pod" and ns == namespace and p["metadata"]["labels"].get("fake/owner") == f"Job/{name}"
            ]
            phases = [p["status"]["phase"] for p in pods]
            if "Failed" in phases:
                condition = {"type": "Failed", "reason": "BackoffLimitExceeded", "message": BACKOFF_LIMIT}
            elif phases and all(phase == "Succeeded" for phase in phases):
                condition = {"type": "Complete", "reason": "CompletionsReached", "message": COMPLETED}
            else:
                continue
            job["status"] = {"conditions": [{**condition, "status": "True"}]}

    def _delete_pod(self, namespace: str, name: str, grace_s: int | None) -> bool:
        pod = self.objects.get(("Pod", namespace, name))
        sandbox = self.sandboxes.get(name)
        if pod is None:
            return False
        if sandbox is None:
            self.objects.pop(("Pod", namespace, name))
            return True
        if pod["metadata"].get("deletionTimestamp"):
            return True
        pod["metadata"]["deletionTimestamp"] = "now"
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30) if grace_s is None else grace_s

        def end() -> None:
            sandbox.stop(grace)
            with self._lock:
                self.objects.pop(("Pod", namespace, name), None)
                self.sandboxes.pop(name, None)

        thread = threading.Thread(target=end, name=f"kubelet-{name}", daemon=True)
        self._stopping.append(thread)
        thread.start()
        return True

    def close(self) -> None:
        """End every pod still running, at once, and wait until each one is gone."""
        with self._lock:
            for pod in list(self.of_kind("Pod")):
                self._delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], 0)
            stopping = list(self._stopping)
        for thread in stopping:
            thread.join(timeout=60)
