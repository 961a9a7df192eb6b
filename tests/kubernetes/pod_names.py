"""The pods a launch API's controller makes of a workload, named and labelled as it names them,
and the DNS names a pod answers to (a headless Service's `<hostname>.<subdomain>`, a PyTorchJob's
per-replica Service). Documented in "Jobs: completion mode", JobSet's "DNS hostnames" and the
training operator's PyTorchJob guide."""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterator

from trainflow.backends.kubernetes.classify import COMPLETION_INDEX, REPLICA_INDEX, REPLICA_TYPE

CLUSTER_DOMAIN = "svc.cluster.local"


def suspended(workload: dict) -> bool:
    spec = workload["spec"]
    return bool(spec.get("suspend") or (spec.get("runPolicy") or {}).get("suspend"))


def _pod(template: dict, name: str, hostname: str, subdomain: str | None, labels: dict, annotations: dict) -> dict:
    spec = {**copy.deepcopy(template["spec"]), "hostname": hostname}
    if subdomain:
        spec["subdomain"] = subdomain
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "creationTimestamp": "",
            "labels": {**(template["metadata"].get("labels") or {}), **labels},
            "annotations": {**(template["metadata"].get("annotations") or {}), **annotations},
        },
        "spec": spec,
    }


def _indexed(job_name: str, job_spec: dict, subdomain: str | None) -> Iterator[tuple[int, dict]]:
    template = job_spec["template"]
    subdomain = template["spec"].get("subdomain") or subdomain
    for index in range(job_spec["completions"]):
        indexed = {COMPLETION_INDEX: str(index)}
        yield (
            index,
            _pod(
                template,
                f"{job_name}-{index}-{secrets.token_hex(3)}",
                f"{job_name}-{index}",  # the Job controller's hostname for an Indexed Job's pod
                subdomain,
                {**indexed, "job-name": job_name},
                indexed,
            ),
        )


def pods_of(workload: dict) -> Iterator[tuple[int, dict]]:
    """(node, pod) for every pod of the workload."""
    kind, name, spec = workload["kind"], workload["metadata"]["name"], workload["spec"]
    if kind == "Job":
        yield from _indexed(name, spec, None)
    elif kind == "JobSet":  # one replicated Job of one replica: its child Job is <jobset>-<replicated job>-0
        replicated = spec["replicatedJobs"][0]
        subdomain = spec.get("network", {}).get("subdomain") or name
        yield from _indexed(f"{name}-{replicated['name']}-0", replicated["template"]["spec"], subdomain)
    elif kind == "PyTorchJob":
        replicas = spec["pytorchReplicaSpecs"]
        roles = [("Master", 0)] + ([("Worker", 1)] if "Worker" in replicas else [])
        for role, first_node in roles:
            for index in range(replicas[role]["replicas"]):
                pod_name = f"{name}-{role.lower()}-{index}"
                labels = {REPLICA_TYPE: role.lower(), REPLICA_INDEX: str(index)}
                yield first_node + index, _pod(replicas[role]["template"], pod_name, pod_name, None, labels, {})


def dns_names(pod: dict, namespace: str) -> list[str]:
    """What resolves to this pod: its name under its subdomain, or its replica's Service."""
    hostname, subdomain = pod["spec"]["hostname"], pod["spec"].get("subdomain")
    if subdomain:
        return [f"{hostname}.{subdomain}", f"{hostname}.{subdomain}.{namespace}.{CLUSTER_DOMAIN}"]
    if REPLICA_TYPE in pod["metadata"]["labels"]:  # the operator's Service of the same name, per replica
        return [hostname, f"{hostname}.{namespace}.{CLUSTER_DOMAIN}"]
    return []
