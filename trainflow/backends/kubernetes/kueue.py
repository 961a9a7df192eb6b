"""Which Kueue LocalQueue admits a run's workload, if any, and in which API version Kueue serves it.

Kueue's current API is kueue.x-k8s.io/v1beta2 (served since Kueue 0.15); v1beta1 is asked for only
when v1beta2 is not served (Kueue 0.20 no longer serves it). The queue is `kubernetes.kueue_queue`
when set (it must exist: a workload labelled for a missing LocalQueue waits forever); otherwise the
LocalQueue named after the run's team (`tracking.tags.team`) when the namespace has one; otherwise
none, and the workload is a plain Job that the cluster schedules at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainflow.backends.kubernetes.cluster import Cluster
from trainflow.backends.kubernetes.config import kubernetes_config
from trainflow.quota import TEAM_TAG
from trainflow.runspec import RunSpec

KUEUE_APIS = ("kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta1")  # newest first
LOCAL_QUEUE = "LocalQueue"
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class KueueError(RuntimeError):
    """The spec names a queue this cluster cannot admit through."""


@dataclass(frozen=True)
class KueueChoice:
    """The Kueue API the cluster serves (None: no Kueue) and the LocalQueue the run uses (None: plain Jobs)."""

    api_version: str | None
    queue: str | None
    source: str  # "spec", "team" or "none"


def served_kueue_api(cluster: Cluster) -> str | None:
    return next((api for api in KUEUE_APIS if cluster.has_api(api, LOCAL_QUEUE)), None)


def choose_queue(cluster: Cluster, spec: RunSpec) -> KueueChoice:
    namespace, named = kubernetes_config(spec).namespace, kubernetes_config(spec).kueue_queue
    api = served_kueue_api(cluster)
    if named:
        if api is None:
            raise KueueError(
                f"kubernetes.kueue_queue: {named!r} needs Kueue ({' or '.join(KUEUE_APIS)}), which this cluster "
                "does not serve; install Kueue or remove kueue_queue"
            )
        if cluster.get(api, LOCAL_QUEUE, namespace, named) is None:
            raise KueueError(
                f"kubernetes.kueue_queue: LocalQueue {namespace}/{named} not found (kubectl get localqueues -n "
                f"{namespace}); a workload in a missing queue is never admitted (docs/kueue.md)"
            )
        return KueueChoice(api, named, "spec")
    team = spec.tracking.tags.get(TEAM_TAG)
    if api and team and _OBJECT_NAME.match(team) and cluster.get(api, LOCAL_QUEUE, namespace, team) is not None:
        return KueueChoice(api, team, "team")
    return KueueChoice(api, None, "none")


def with_queue(spec: RunSpec, queue: str | None) -> RunSpec:
    """`spec` with the chosen LocalQueue, so the workload is labelled and created suspended for it."""
    if queue == kubernetes_config(spec).kueue_queue:
        return spec
    return spec.model_copy(update={"backend_config": kubernetes_config(spec).model_copy(update={"kueue_queue": queue})})
