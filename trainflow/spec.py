"""The run spec: everything about a training job, loaded from YAML and validated up front.

A spec that loads is a spec that can run: unknown keys, impossible values and missing files are
refused here, before anything is provisioned.
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class SpecError(ValueError):
    """A spec that cannot run; the message names the file or field and says what to do."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Workload(Section):
    """What to train: the user's script and its arguments."""

    entrypoint: str = Field(
        title="Entrypoint", description="Training script run by every worker (path relative to the working directory)."
    )
    args: list[str] = Field(default_factory=list, title="Arguments", description="Arguments passed to the script.")
    steps: Annotated[int, Field(gt=0)] = Field(
        default=100, title="Steps", description="Total number of training steps of the job."
    )


class Backend(str, Enum):
    local = "local"
    kubernetes = "kubernetes"


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

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")


class FaultTolerance(Section):
    """How failures are detected and retried."""

    max_restarts: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3, title="Max restarts", description="Attempts after the first one before the run fails."
    )
    heartbeat_interval_s: Annotated[float, Field(gt=0, le=60)] = Field(default=1.0, title="Heartbeat interval (s)")
    heartbeat_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=10.0, title="Heartbeat timeout (s)", description="A node silent this long is lost."
    )
    hang_timeout_s: Annotated[float, Field(gt=0, le=86400)] | None = Field(
        default=None, title="Hang timeout (s)", description="No step progress this long is a hang (default: derived)."
    )
    preemption_grace_s: Annotated[float, Field(gt=0, le=3600)] = Field(default=30.0, title="Preemption grace (s)")
    orchestrator_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=30.0,
        title="Orchestrator timeout (s)",
        description="Workers stop when the orchestrator has been unreachable this long.",
    )

    @model_validator(mode="after")
    def _heartbeat_timeout_exceeds_interval(self) -> FaultTolerance:
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must be more than twice heartbeat_interval_s")
        return self


class Tracking(Section):
    """Where the run is recorded."""

    uri: str | None = Field(
        default=None, title="MLflow tracking URI", description="Default: sqlite:///<TRAINFLOW_HOME>/mlflow.db."
    )
    experiment: str | None = Field(default=None, title="Experiment", description="Default: the spec's name.")


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
        if self.parallel.backend == CommBackend.nccl and self.resources.gpu == 0:
            raise ValueError("parallel.backend: nccl needs resources.gpu > 0")
        if self.resources.gpu and self.resources.procs_per_node > self.resources.gpu:
            raise ValueError("resources.procs_per_node: more processes than GPUs on a node")
        return self

    @property
    def world_size(self) -> int:
        return self.resources.world_size

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
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: spec file not found") from None
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
