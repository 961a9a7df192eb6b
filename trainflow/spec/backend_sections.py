"""Backend sections (moving to their backends)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from trainflow.spec.section import Section


class LaunchApi(str, Enum):
    indexed_job = "indexed-job"
    jobset = "jobset"
    pytorchjob = "pytorchjob"


class Toleration(Section):
    """One Kubernetes toleration, written as in a pod spec."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Annotated[int, Field(ge=0)] | None = Field(default=None, alias="tolerationSeconds")

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


class Kubernetes(Section):
    """Where and how the job runs with resources.backend: kubernetes (ignored by other backends)."""

    namespace: str = Field(default="default", pattern=_DNS_LABEL, title="Namespace")
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
    node_selector: dict[str, str] = Field(default_factory=dict, title="Node selector")
    tolerations: list[Toleration] = Field(default_factory=list, title="Tolerations")
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


_SLURM_TIME = r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^UNLIMITED$"


class Slurm(Section):
    """Where and how the job runs with resources.backend: slurm (ignored by other backends)."""

    partition: str | None = Field(default=None, min_length=1, title="Partition", description="Default: the cluster's default partition.")
    account: str | None = Field(default=None, min_length=1, title="Account")
    qos: str | None = Field(default=None, min_length=1, title="QOS")
    time_limit: str | None = Field(
        default=None,
        pattern=_SLURM_TIME,
        title="Time limit",
        description="Per attempt, in Slurm's form: minutes, HH:MM:SS or D-HH:MM:SS (default: the partition's).",
    )
    warn_before_limit_s: Annotated[int, Field(gt=0, le=65535)] | None = Field(
        default=None,
        title="Warn before the limit (s)",
        description="SIGTERM the workers this long before the time limit: an emergency checkpoint, then a new attempt.",
    )
    constraint: str | None = Field(default=None, min_length=1, title="Constraint", description="Node features (--constraint).")
    gres: str | None = Field(default=None, min_length=1, title="GRES", description="Generic resources per node (--gres), e.g. gpu:a100:4.")
    exclusive: bool = Field(default=False, title="Exclusive", description="Whole nodes for the job (--exclusive).")
    sbatch_args: list[str] = Field(
        default_factory=list, title="Extra sbatch options", description="Passed to sbatch as they are, e.g. [--reservation=x]."
    )
    status_host: str | None = Field(
        default=None,
        title="Status host",
        description="Address compute nodes use to reach the orchestrator's status channel (default: "
        "TRAINFLOW_STATUS_HOST, else this machine's address on the route to slurmctld).",
    )
