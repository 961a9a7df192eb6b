"""What the Kubernetes backend holds for one run, for each attempt, and what its release removed."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainflow.backends.base import Allocation, AttemptHandle, NodeExit, ReleaseReport
from trainflow.backends.kubernetes.config import LaunchApi
from trainflow.backends.kubernetes.kueue import KueueChoice
from trainflow.backends.kubernetes.observe import PodObserver


@dataclass
class KubernetesAllocation(Allocation):
    namespace: str = "default"
    launch_api: LaunchApi = LaunchApi.indexed_job
    service: str = ""  # the run's headless Service: worker pods' DNS names for rendezvous
    kueue: KueueChoice = field(default_factory=lambda: KueueChoice(None, None, "none"))
    image: dict | None = None  # the image the workers run, once resolved (recorded in MLflow)
    config_secrets: list[str] = field(default_factory=list)  # every attempt's worker-config Secret, by name


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
    log_max_bytes: int = 32 * 2**20  # what each pod's kept log may hold (tracking.max_node_log_mb)
    ranks_per_pod: int = 1
    evidence: dict[str, dict] = field(default_factory=dict)  # a failed pod's name -> what its log says


@dataclass
class KubernetesReleaseReport(ReleaseReport):
    deleted_objects: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {**super().as_dict(), "deleted_objects": self.deleted_objects}
