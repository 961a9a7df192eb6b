"""Cluster calls whose failure is a fact to report, not an exception: listing, reading and deleting
a run's objects during stop and release, and waiting until they are gone."""

from __future__ import annotations

import time
from collections.abc import Callable

from trainflow.backends.base import ReleaseReport
from trainflow.backends.kubernetes.cluster import Cluster, ClusterError

Kind = tuple[str, str]  # apiVersion, kind

POD: Kind = ("v1", "Pod")
WORKER_CONFIG_SECRET: Kind = ("v1", "Secret")
SERVICE: Kind = ("v1", "Service")


def list_quietly(
    cluster: Cluster, kind: Kind, namespace: str, selector: str, report: ReleaseReport | None = None
) -> list[dict]:
    try:
        return cluster.list(kind[0], kind[1], namespace, selector)
    except ClusterError as exc:
        if report is not None and exc.status != 404 and f"cannot list {kind[1]}: {exc}" not in report.survivors:
            report.survivors.append(f"cannot list {kind[1]}: {exc}")
        return []


def get_quietly(cluster: Cluster, kind: Kind, namespace: str, name: str, report: ReleaseReport) -> dict | None:
    try:
        return cluster.get(kind[0], kind[1], namespace, name)
    except ClusterError as exc:
        report.survivors.append(f"cannot read {kind[1]}/{name}: {exc}")
        return None


def delete_quietly(
    cluster: Cluster,
    kind: Kind,
    namespace: str,
    name: str,
    grace_s: int | None = None,
    report: ReleaseReport | None = None,
) -> bool:
    try:
        return cluster.delete(kind[0], kind[1], namespace, name, grace_s)
    except ClusterError as exc:
        if report is not None:
            report.survivors.append(f"{kind[1]}/{name}: {exc}")
        return False


def wait_gone(
    cluster: Cluster,
    kinds: list[Kind],
    namespace: str,
    selector: str,
    timeout_s: float,
    sleep: Callable[[float], None],
    report: ReleaseReport | None = None,
) -> list[str]:
    """Wait until no object of `kinds` matches `selector`; returns those left at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [
            f"{kind[1]}/{doc['metadata']['name']}"
            for kind in kinds
            for doc in list_quietly(cluster, kind, namespace, selector, report)
        ]
        if not left or time.monotonic() >= deadline:
            return left
        sleep(1.0)


def log_tail(cluster: Cluster, namespace: str, pod: dict, container: str, lines: int) -> str:
    try:
        return cluster.pod_log(namespace, pod["metadata"]["name"], container, lines)
    except ClusterError as exc:
        return f"(log unavailable: {exc})"
