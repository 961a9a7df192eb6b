"""The Kubernetes backend's own spec section (`kubernetes:`) and the checks it needs of the rest of the spec."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from trainflow.section import BackendConfig, Section

if TYPE_CHECKING:
    from trainflow.runspec import RunSpec


class LaunchApi(str, Enum):
    indexed_job = "indexed-job"
    jobset = "jobset"
    pytorchjob = "pytorchjob"


class Toleration(Section):
    """One Kubernetes toleration, written as in a pod spec."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    key: str | None = Field(default=None, description="The taint's key; none (with Exists) tolerates every taint.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Equal: the taint's value must match.")
    value: str | None = Field(default=None, description="The taint's value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="The taint's effect to tolerate; none: every effect."
    )
    toleration_seconds: Annotated[int, Field(ge=0)] | None = Field(
        default=None, alias="tolerationSeconds", description="With NoExecute: how long the pod stays once tainted."
    )

    @model_validator(mode="after")
    def _as_kubernetes_accepts_it(self) -> Toleration:
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator: Exists")
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("a toleration with operator: Exists takes no value")
        return self


_DNS_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$"
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$"


class KubernetesConfig(BackendConfig):
    """Where and how the job runs with resources.backend: kubernetes (the spec's `kubernetes:` section)."""

    location: ClassVar[str] = "kubernetes"
    remote_checkpoints_because: ClassVar[str | None] = "pods and the orchestrator share no disk"
    backend: Literal["kubernetes"] = "kubernetes"

    namespace: str = Field(
        default="default", pattern=_DNS_LABEL, title="Namespace", description="Where the job's pods and service go."
    )
    image: str | None = Field(
        default=None,
        title="Image",
        description="Worker image: a reference with a tag or digest is used as is; a bare repository gets "
        "a tag derived from the lock file and code, built in the cluster when missing.",
    )
    service_account: str | None = Field(
        default=None, pattern=_DNS_SUBDOMAIN, title="Service account", description="Of the worker pods."
    )
    launch_api: LaunchApi = Field(
        default=LaunchApi.indexed_job,
        title="Launch API",
        description="indexed-job (built in), jobset or pytorchjob (need those CRDs in the cluster).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, title="Node selector", description="Labels a node must have, as in a pod spec."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, title="Tolerations", description="Taints the pods tolerate, as in a pod spec."
    )
    topology_key: str | None = Field(
        default=None,
        title="Topology key",
        description="Keep all nodes of the job in one domain of this node label (e.g. topology.kubernetes.io/zone).",
    )
    kueue_queue: str | None = Field(
        default=None, pattern=_DNS_SUBDOMAIN, title="Kueue queue", description="LocalQueue for gang admission."
    )
    s3_secret: str | None = Field(
        default=None,
        pattern=_DNS_SUBDOMAIN,
        title="S3 credentials secret",
        description="Name of a Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and optionally "
        "AWS_ENDPOINT_URL_S3, AWS_DEFAULT_REGION); never the keys themselves.",
    )
    registry_secret: str | None = Field(
        default=None,
        pattern=_DNS_SUBDOMAIN,
        title="Registry secret",
        description="A kubernetes.io/dockerconfigjson Secret: pulls the image and pushes in-cluster builds.",
    )
    local_tier_volume: str | None = Field(
        default=None,
        pattern=_QUANTITY,
        title="Local tier volume",
        description="Size limit of each node's local checkpoint tier (an emptyDir, e.g. 50Gi); unlimited if unset.",
    )
    status_host: str | None = Field(
        default=None,
        title="Status host",
        description="Address pods use to reach the orchestrator's status channel "
        "(default: TRAINFLOW_STATUS_HOST, set to the flow pod's IP by the work-pool template).",
    )

    def check(self) -> None:
        if not self.image:
            raise ValueError("kubernetes.image: required with resources.backend: kubernetes (a repository or image)")


def kubernetes_config(spec: RunSpec) -> KubernetesConfig:
    """The spec's `kubernetes:` section (a RunSpec whose backend is kubernetes)."""
    return spec.config_of(KubernetesConfig)
