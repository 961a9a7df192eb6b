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


def kept_log(tail: str, tail_lines: int, max_bytes: int) -> str:
    """A pod's log as the attempt keeps it: the last `tail_lines` lines the API gave (`tail`), at most
    `max_bytes` of them from a line's start, behind a line saying so when the pod's log may hold more."""
    data = tail.encode(errors="replace")
    if len(data) <= max_bytes and tail.count("\n") < tail_lines:
        return tail  # the whole log
    if len(data) > max_bytes:
        data = data[-max_bytes:]
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            data = data[newline + 1 :]
    note = (
        f"[trainflow: the pod's earlier output is not kept here; this log keeps its last {tail_lines} lines, "
        f"{max_bytes} bytes at most (tracking.max_node_log_mb)]\n"
    )
    return note + data.decode(errors="replace")


def log_tail(cluster: Cluster, namespace: str, pod: dict, container: str, lines: int) -> str:
    try:
        return cluster.pod_log(namespace, pod["metadata"]["name"], container, lines)
    except ClusterError as exc:
        return f"(log unavailable: {exc})"
