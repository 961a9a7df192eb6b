"""An in-memory `Cluster` for unit tests: stores objects, matches label selectors, records every
API call as (verb, api group, resource) so tests can hold the calls against infra/rbac.yaml, and
plays the Job/JobSet/PyTorchJob controllers just enough to create pods when asked."""

from __future__ import annotations

import copy

from trainflow.backends.kubernetes.cluster import ClusterError

PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "ResourceQuota": "resourcequotas",
    "Job": "jobs",
    "JobSet": "jobsets",
    "PyTorchJob": "pytorchjobs",
    "LocalQueue": "localqueues",
}
BUILT_IN_APIS = {("v1", k) for k in ("Pod", "Service", "ConfigMap", "Secret", "ResourceQuota")} | {("batch/v1", "Job")}
# Kueue as a cluster serves it: the current API (Kueue >= 0.15), the old one (< 0.20), or give neither
KUEUE_V1BETA2 = ("kueue.x-k8s.io/v1beta2", "LocalQueue")
KUEUE_V1BETA1 = ("kueue.x-k8s.io/v1beta1", "LocalQueue")


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def matches(labels: dict, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeCluster:
    def __init__(self, namespaces=("trainflow",), crds=(), namespace_readable=True):
        self.namespaces = set(namespaces)
        self.apis = set(BUILT_IN_APIS) | set(crds)
        self.namespace_readable = namespace_readable
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.deleted: list[tuple[str, str, int | None]] = []
        self.logs: dict[str, str] = {}
        self.fail_next: dict[str, ClusterError] = {}

    # the Cluster protocol ---------------------------------------------------------------------

    def has_api(self, api_version: str, kind: str) -> bool:
        return (api_version, kind) in self.apis  # discovery: open to every authenticated identity

    def namespace_exists(self, namespace: str) -> bool | None:
        self.calls.append(("get", "", "namespaces"))
        return (namespace in self.namespaces) if self.namespace_readable else None

    def get(self, api_version, kind, namespace, name):
        self._call("get", api_version, kind)
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found else None

    def list(self, api_version, kind, namespace, selector):
        self._call("list", api_version, kind)
        return [
            copy.deepcopy(doc)
            for (k, ns, _), doc in sorted(self.objects.items())
            if k == kind and ns == namespace and matches((doc.get("metadata") or {}).get("labels") or {}, selector)
        ]

    def create(self, doc):
        kind, meta = doc["kind"], doc["metadata"]
        self._call("create", doc["apiVersion"], kind)
        if meta["namespace"] not in self.namespaces:
            raise ClusterError(f'create {kind}: namespaces "{meta["namespace"]}" not found', 404)
        key = (kind, meta["namespace"], meta["name"])
        if key in self.objects:
            raise ClusterError(f'create {kind}: {kind.lower()}s "{meta["name"]}" already exists', 409)
        self.objects[key] = copy.deepcopy(doc)
        return copy.deepcopy(doc)

    def delete(self, api_version, kind, namespace, name, grace_s=None):
        self._call("delete", api_version, kind)
        self.deleted.append((kind, name, grace_s))
        gone = self.objects.pop((kind, namespace, name), None) is not None
        if gone and kind in ("Job", "JobSet", "PyTorchJob"):  # foreground: dependents go first
            for key, doc in list(self.objects.items()):
                owner = (doc["metadata"].get("labels") or {}).get("fake/owner")
                if owner == f"{kind}/{name}":
                    self.objects.pop(key)
        return gone

    def pod_log(self, namespace, name, container, tail_lines):
        self.calls.append(("get", "", "pods/log"))
        return self.logs.get(name, f"log of {name}\n")

    # test controls ----------------------------------------------------------------------------

    def _call(self, verb: str, api_version: str, kind: str) -> None:
        self.calls.append((verb, group_of(api_version), PLURALS[kind]))
        error = self.fail_next.pop(f"{verb} {kind}", None)
        if error is not None:
            raise error
        if (api_version, kind) not in self.apis:
            raise ClusterError(f"the cluster has no {kind} API ({api_version})", 404)

    def add(self, doc: dict) -> dict:
        meta = doc["metadata"]
        self.objects[(doc["kind"], meta["namespace"], meta["name"])] = copy.deepcopy(doc)
        return doc

    def add_local_queue(self, name: str, namespace: str = "trainflow") -> dict:
        """A LocalQueue in the newest Kueue API this cluster serves."""
        api_version = next(api for api, _ in (KUEUE_V1BETA2, KUEUE_V1BETA1) if (api, "LocalQueue") in self.apis)
        return self.add(
            {
                "apiVersion": api_version,
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterQueue": "trainflow"},
            }
        )

    def of_kind(self, kind: str) -> list[dict]:
        return [doc for (k, _, _), doc in sorted(self.objects.items()) if k == kind]

    def run_workload(self, pod_status) -> list[dict]:
        """Play the controllers: one pod per node of every workload, with `pod_status(node)`'s status."""
        pods = []
        for kind in ("Job", "JobSet", "PyTorchJob"):
            for doc in self.of_kind(kind):
                if (doc["metadata"]["labels"] or {}).get("trainflow.dev/component") != "workers":
                    continue
                for node, template in templates_by_node(doc):
                    status = pod_status(node)
                    pod = {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"{doc['metadata']['name']}-{node}-pod",
                            "namespace": doc["metadata"]["namespace"],
                            "creationTimestamp": "2025-06-01T10:00:00Z",
                            "labels": {
                                **template["metadata"]["labels"],
                                "fake/owner": f"{kind}/{doc['metadata']['name']}",
                            },
                            "annotations": {},
                        },
                        "spec": copy.deepcopy(template["spec"]),
                        "status": copy.deepcopy(status),
                    }
                    if kind == "PyTorchJob":
                        replica = "master" if node == 0 else "worker"
                        pod["metadata"]["labels"]["training.kubeflow.org/replica-type"] = replica
                        pod["metadata"]["labels"]["training.kubeflow.org/replica-index"] = str(max(0, node - 1))
                    else:
                        pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = str(node)
                    pods.append(self.add(pod))
        return pods

    def set_pod_status(self, node: int, status: dict) -> None:
        for doc in self.of_kind("Pod"):
            if _node(doc) == node:
                doc["status"] = copy.deepcopy(status)


def _node(pod: dict) -> int | None:
    from trainflow.backends.kubernetes.classify import node_index

    return node_index(pod)


def templates_by_node(doc: dict):
    kind, spec = doc["kind"], doc["spec"]
    if kind == "Job":
        return [(n, spec["template"]) for n in range(spec["completions"])]
    if kind == "JobSet":
        job = spec["replicatedJobs"][0]["template"]["spec"]
        return [(n, job["template"]) for n in range(job["completions"])]
    replicas = spec["pytorchReplicaSpecs"]
    workers = replicas.get("Worker", {"replicas": 0})
    return [(0, replicas["Master"]["template"])] + [(n + 1, workers["template"]) for n in range(workers["replicas"])]
