"""The run spec: everything about a training job, loaded from YAML and validated up front.

A spec that loads is a spec that can run: unknown keys, impossible values and missing files are
refused here, before anything is provisioned.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from trainflow.contracts import RETRYABLE, Outcome


class SpecError(ValueError):
    """A spec that cannot run; the message names the file or field and says what to do."""


INT64_MAX = 2**63 - 1


def _number_type(annotation: Any) -> type | None:
    """int or float when a field holds that number (optionally None), else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = {_number_type(arg) for arg in typing.get_args(annotation) if arg is not type(None)}
        return kinds.pop() if len(kinds) == 1 else None
    if typing.get_origin(annotation) is Annotated:
        return _number_type(typing.get_args(annotation)[0])
    return annotation if annotation in (int, float) else None


def _shown(value: Any) -> str:
    """A value as the spec's YAML spells it."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def strict_number(value: Any, kind: type) -> Any:
    """A number field takes a number of its kind, nothing that merely converts to one."""
    if value is None:
        return value
    if kind is int:
        if type(value) is not int:
            raise ValueError(f"must be a whole number, not {_shown(value)}")
        if abs(value) > INT64_MAX:
            raise ValueError(f"{value} is out of range")
        return value
    if type(value) not in (int, float):
        raise ValueError(f"must be a number, not {_shown(value)}")
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, not {value!r}")
    return value


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # pydantic's lax mode reads `true` as 1, "inf" as infinity and 2.0 as 2; a spec means what it
    # says, so every number field of every section (also ones added later) takes numbers only
    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        kind = _number_type(field.annotation) if field else None
        return strict_number(value, kind) if kind else value


class WorkloadMode(str, Enum):
    runtime = "runtime"  # the script uses trainflow.runtime: progress, checkpoints, exact resume, ...
    plain = "plain"  # a plain torchrun script: launched and watched by its exits only


class Workload(Section):
    """What to train: the user's script and its arguments."""

    entrypoint: str = Field(
        title="Entrypoint", description="Training script run by every worker (path relative to the working directory)."
    )
    args: list[str] = Field(
        default_factory=list, title="Arguments",
        description="Arguments passed to the script; recorded verbatim (spec, MLflow, Prefect), so never a secret.",
    )
    secret_env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list, title="Secret environment variables",
        description="Names of environment variables of the orchestrator handed to every worker at launch; "
        "only the names are recorded, never the values.",
    )
    steps: Annotated[int, Field(gt=0)] = Field(
        default=100, title="Steps", description="Total number of training steps of the job."
    )
    mode: WorkloadMode = Field(
        default=WorkloadMode.runtime,
        title="Mode",
        description="runtime: the script uses trainflow.runtime (everything); plain: a plain torchrun script "
        "that never imports it (launched and watched by its exits; progress, hang detection, checkpoints, "
        "divergence and stragglers are off).",
    )


class Backend(str, Enum):
    local = "local"
    kubernetes = "kubernetes"
    slurm = "slurm"


class LocalNetwork(str, Enum):
    loopback = "loopback"
    namespaces = "namespaces"


class Resources(Section):
    """Where the job runs and how big it is."""

    backend: Backend = Field(default=Backend.local, title="Backend", description="Launcher that runs the workers.")
    nodes: Annotated[int, Field(gt=0, le=1024)] = Field(default=2, title="Nodes", description="Number of nodes.")
    procs_per_node: Annotated[int, Field(gt=0, le=64)] = Field(
        default=1, title="Processes per node", description="Worker processes (ranks) on each node."
    )
    cpu: Annotated[float, Field(gt=0)] = Field(default=1.0, title="CPU per node", description="CPU cores per node.")
    memory: str = Field(
        default="2Gi",
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$",
        title="Memory per node",
        description="Memory per node, Kubernetes quantity (e.g. 2Gi).",
    )
    gpu: Annotated[int, Field(ge=0, le=16)] = Field(default=0, title="GPUs per node", description="GPUs per node.")
    network: LocalNetwork = Field(
        default=LocalNetwork.loopback,
        title="Local network",
        description="Local backend: all nodes on loopback, or each in its own network namespace (root; node-loss drills).",
    )
    min_nodes: Annotated[int, Field(gt=0, le=1024)] | None = Field(
        default=None,
        title="Minimum nodes",
        description="Continue with this many nodes when lost ones cannot come back (default: all nodes).",
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


class Strategy(str, Enum):
    ddp = "ddp"
    fsdp = "fsdp"
    hybrid = "hybrid"


class CommBackend(str, Enum):
    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


class Parallel(Section):
    """How the model and data are split across the ranks."""

    strategy: Strategy = Field(default=Strategy.ddp, title="Strategy", description="Parallel strategy.")
    backend: CommBackend = Field(
        default=CommBackend.auto,
        title="Communication backend",
        description="Collective library: auto picks nccl with GPUs, gloo on CPU.",
    )
    data: Annotated[int, Field(gt=0)] | None = Field(
        default=None, title="Data-parallel degree", description="Defaults to world size / (tensor × pipeline)."
    )
    tensor: Annotated[int, Field(gt=0)] = Field(default=1, title="Tensor-parallel degree")
    pipeline: Annotated[int, Field(gt=0)] = Field(default=1, title="Pipeline-parallel degree")
    collective_timeout_s: Annotated[float, Field(gt=0, le=7200)] = Field(
        default=600, title="Collective timeout (s)", description="Process-group timeout for one collective."
    )


_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def checkpoint_uri_problem(uri: str) -> str | None:
    """Why `uri` is neither a local path, file://PATH nor s3://bucket[/prefix]; None when it is one."""
    supported = "use a local path, file:///absolute/path or s3://bucket/prefix"
    if uri.lower().startswith("s3:") and not uri.startswith("s3://"):
        return f"{uri!r} is not an S3 URI: write s3://bucket/prefix (lowercase s3, two slashes)"
    if uri.startswith("s3://"):
        bucket = uri.removeprefix("s3://").split("/", 1)[0]
        if not _S3_BUCKET.match(bucket):
            return f"{uri!r}: {bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, dots, dashes)"
        return None
    scheme = _URI_SCHEME.match(uri)
    if scheme and scheme.group(1) != "file":
        return f"{uri!r}: the {scheme.group(1)}:// scheme is not supported; {supported}"
    if uri.startswith("file:") and not uri.startswith("file:///"):
        return f"{uri!r}: a file URI is file:///absolute/path"
    return None


class Checkpoint(Section):
    """Where and how often the training state is saved."""

    uri: str = Field(
        default="checkpoints",
        min_length=1,
        title="Checkpoint URI",
        description="Local directory (relative paths live under TRAINFLOW_HOME) or s3://bucket/prefix.",
    )
    every_steps: Annotated[int, Field(gt=0)] = Field(
        default=20, title="Every N steps", description="Save a checkpoint every N steps (and at the last step)."
    )
    keep_last: Annotated[int, Field(ge=2)] = Field(
        default=3, title="Keep last", description="Committed checkpoints kept per run (at least 2)."
    )
    keep_every_steps: Annotated[int, Field(ge=0)] = Field(
        default=0,
        title="Keep every N steps",
        description="Also keep every checkpoint whose step is a multiple of N, for good (0: off).",
    )
    snapshot_every_s: Annotated[float, Field(ge=0, le=86400)] = Field(
        default=60,
        title="Snapshot every (s)",
        description="Copy a checkpoint from node-local disk to the checkpoint URI at most this often "
        "(0: every checkpoint); a lost node costs at most this much training. The first of an attempt, "
        "kept steps, the last step and a preemption's always go.",
    )
    local_tier: bool = Field(
        default=True,
        title="Node-local tier",
        description="Save to each node's local disk first and restore from there when it verifies.",
    )

    @field_validator("uri")
    @classmethod
    def _supported_scheme(cls, uri: str) -> str:
        problem = checkpoint_uri_problem(uri)
        if problem:
            raise ValueError(problem)
        return uri

    @model_validator(mode="after")
    def _kept_steps_are_saved(self) -> Checkpoint:
        if self.keep_every_steps and self.keep_every_steps % self.every_steps:
            raise ValueError(
                f"keep_every_steps ({self.keep_every_steps}) must be a multiple of every_steps ({self.every_steps})"
            )
        return self

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")


DEFAULT_RETRY_ON = [o for o in RETRYABLE if o != Outcome.USER_ERROR]


class FaultTolerance(Section):
    """How failures are detected, classified and retried."""

    max_restarts: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3,
        title="Max restarts",
        description="Retries after crashes, kills, hangs, lost nodes and divergence before the run fails.",
    )
    max_preemptions: Annotated[int, Field(ge=0, le=1000)] = Field(
        default=10, title="Max preemptions", description="Separate budget of retries after preemptions."
    )
    max_infra_failures: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3, title="Max infrastructure failures", description="Separate budget after rendezvous/storage failures."
    )
    max_user_errors: Annotated[int, Field(ge=0, le=100)] = Field(
        default=0, title="Max user errors", description="Retries after an exception in the training code or a NaN loss."
    )
    retry_on: list[Outcome] = Field(
        default_factory=lambda: list(DEFAULT_RETRY_ON),
        title="Retry on",
        description="Outcomes that take the retry branch (USER_ERROR also needs max_user_errors > 0).",
    )
    backoff_s: Annotated[float, Field(ge=0, le=3600)] = Field(
        default=1.0, title="Backoff (s)", description="Wait before the second retry, doubling after; the first retry and preemptions never wait."
    )
    backoff_max_s: Annotated[float, Field(ge=0, le=3600)] = Field(default=60.0, title="Longest backoff (s)")
    heartbeat_interval_s: Annotated[float, Field(gt=0, le=60)] = Field(default=1.0, title="Heartbeat interval (s)")
    heartbeat_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=10.0, title="Heartbeat timeout (s)", description="A node silent this long is lost."
    )
    hang_timeout_s: Annotated[float, Field(gt=0, le=86400)] | None = Field(
        default=None,
        title="Hang timeout (s)",
        description="No step progress this long is a hang (default: 20 x the slowest step, at least 30 s).",
    )
    startup_timeout_s: Annotated[float, Field(gt=0, le=86400)] = Field(
        default=600.0,
        title="Start-up timeout (s)",
        description="From launch to every rank's first step (imports, data, rendezvous, restore); past it "
        "the attempt is HUNG, with stacks. Plain scripts are not limited.",
    )
    preemption_grace_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=30.0, title="Preemption grace (s)", description="Time from SIGTERM to SIGKILL: the emergency checkpoint must fit."
    )
    orchestrator_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=30.0,
        title="Orchestrator timeout (s)",
        description="Workers stop when the orchestrator has been unreachable this long.",
    )
    straggler_factor: Annotated[float, Field(gt=1, le=100)] = Field(
        default=1.5, title="Straggler factor", description="Compute time above this multiple of the other ranks' median..."
    )
    straggler_steps: Annotated[int, Field(ge=1, le=10000)] = Field(
        default=5, title="Straggler steps", description="...for this many reports in a row marks a straggler."
    )
    divergence_check_every_steps: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        default=50, title="Divergence check every N steps", description="Compare replicas' parameter hashes (0: never)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> FaultTolerance:
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must be more than twice heartbeat_interval_s")
        if self.backoff_max_s < self.backoff_s:
            raise ValueError("backoff_max_s must be at least backoff_s")
        if len(set(self.retry_on)) != len(self.retry_on):
            raise ValueError("retry_on lists an outcome twice")
        if not_failures := [o.value for o in self.retry_on if o not in RETRYABLE]:
            raise ValueError(f"retry_on lists {', '.join(not_failures)}, which is not a failure")
        if Outcome.USER_ERROR in self.retry_on and self.max_user_errors == 0:
            raise ValueError("retry_on includes USER_ERROR but max_user_errors is 0")
        return self


class Tracking(Section):
    """Where the run is recorded."""

    uri: str | None = Field(
        default=None, title="MLflow tracking URI", description="Default: sqlite:///<TRAINFLOW_HOME>/mlflow.db."
    )
    experiment: str | None = Field(default=None, title="Experiment", description="Default: the spec's name.")
    tags: dict[str, str] = Field(
        default_factory=dict,
        title="Tags",
        description="Extra MLflow tags, e.g. owner and team, so device-hours can be attributed.",
    )
    step_metrics_every_s: Annotated[float, Field(ge=0, le=3600)] = Field(
        default=0.1,
        title="Step metrics every (s)",
        description="Steps faster than this are recorded as one point per interval, at its last step "
        "(loss and step timings: their mean; other metrics: the last value); slower steps one by one "
        "(0: every step).",
    )
    mean_metrics: list[str] = Field(
        default_factory=list,
        title="Metrics averaged over an interval",
        description="Script metrics recorded as their mean over a step-metrics interval, like loss; "
        "any other metric is recorded as its last value (a learning rate is never averaged).",
    )


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


class RunSpec(Section):
    """A training job: what to train, where, how it is split, saved, protected and recorded."""

    name: str = Field(
        pattern=r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$",
        title="Name",
        description="Job name: lowercase letters, digits and dashes.",
    )
    seed: Annotated[int, Field(ge=0, lt=2**32)] = Field(default=0, title="Seed")
    workload: Workload
    resources: Resources = Field(default_factory=Resources)
    parallel: Parallel = Field(default_factory=Parallel)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    fault_tolerance: FaultTolerance = Field(default_factory=FaultTolerance)
    tracking: Tracking = Field(default_factory=Tracking)
    kubernetes: Kubernetes = Field(default_factory=Kubernetes)
    slurm: Slurm = Field(default_factory=Slurm)

    @model_validator(mode="after")
    def _kubernetes_needs_shared_storage_and_image(self) -> RunSpec:
        if self.resources.backend != Backend.kubernetes:
            return self
        if not self.checkpoint.is_s3:
            raise ValueError(
                "checkpoint.uri: the kubernetes backend needs an s3:// URI (pods and the orchestrator share no disk)"
            )
        if not self.kubernetes.image:
            raise ValueError("kubernetes.image: required with resources.backend: kubernetes (a repository or image)")
        return self

    @model_validator(mode="after")
    def _degrees_match_world_size(self) -> RunSpec:
        world = self.resources.world_size
        model_degree = self.parallel.tensor * self.parallel.pipeline
        if self.parallel.data is None:
            if world % model_degree:
                raise ValueError(
                    f"parallel: tensor × pipeline = {model_degree} does not divide the world size {world}"
                )
            self.parallel.data = world // model_degree
        product = self.parallel.data * model_degree
        if product != world:
            raise ValueError(
                f"parallel: data × tensor × pipeline = {product} but the world size "
                f"(nodes × procs_per_node) is {world}"
            )
        min_nodes = self.resources.min_nodes
        if min_nodes is not None:
            if min_nodes > self.resources.nodes:
                raise ValueError(f"resources.min_nodes: {min_nodes} is more than resources.nodes ({self.resources.nodes})")
            if (min_nodes * self.resources.procs_per_node) % model_degree:
                raise ValueError(f"resources.min_nodes: tensor × pipeline = {model_degree} does not divide the smaller world")
        if self.parallel.strategy == Strategy.hybrid and self.resources.procs_per_node % model_degree:
            raise ValueError(
                f"parallel.strategy: hybrid shards within a node, so tensor × pipeline = {model_degree} "
                f"must divide resources.procs_per_node ({self.resources.procs_per_node})"
            )
        if self.parallel.backend == CommBackend.nccl and self.resources.gpu == 0:
            raise ValueError("parallel.backend: nccl needs resources.gpu > 0")
        if self.resources.gpu and self.resources.procs_per_node > self.resources.gpu:
            raise ValueError("resources.procs_per_node: more processes than GPUs on a node")
        return self

    @property
    def world_size(self) -> int:
        return self.resources.world_size

    def with_nodes(self, nodes: int) -> RunSpec:
        """The same job on fewer nodes (after a lost node is excluded); degrees follow the world size."""
        raw = self.model_dump(mode="json")
        raw["resources"]["nodes"] = nodes
        raw["parallel"]["data"] = None
        return RunSpec.model_validate(raw)

    def comm_backend(self) -> str:
        if self.parallel.backend != CommBackend.auto:
            return self.parallel.backend.value
        return "nccl" if self.resources.gpu > 0 else "gloo"

    def spec_hash(self) -> str:
        """sha256 of the resolved spec in canonical form: two runs of one job share it."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunSpec:
    """Read a spec file, apply `key.path=value` overrides and validate; SpecError names the problem."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: spec file not found") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory; give the spec's YAML file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (a spec is YAML in UTF-8)") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise SpecError(f"{path}: not valid YAML{where}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a spec is a YAML mapping with name, workload, resources, ...")
    for item in overrides:
        apply_override(raw, item)
    return parse_spec(raw, source=str(path))


def parse_spec(raw: dict[str, Any], source: str = "spec") -> RunSpec:
    try:
        return RunSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(f"{source}: {describe_validation_error(exc)}") from None


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `a.b.c=value` override; the value is read as YAML (so 20 is an int, [a, b] a list)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise SpecError(f"--set {item!r}: expected key.path=value")
    *parents, leaf = key.split(".")
    node = raw
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"--set {item!r}: {part} is not a section")
        node = child
    try:
        node[leaf] = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        raise SpecError(f"--set {item!r}: value is not valid YAML") from None


def describe_validation_error(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "missing":
            message = "required field is missing"
        problems.append(f"{field}: {message}" if field else message)
    return "; ".join(problems)
