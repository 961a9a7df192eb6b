"""The Slurm backend's own spec section (`slurm:`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import Field

from trainflow.section import BackendConfig

if TYPE_CHECKING:
    from trainflow.runspec import RunSpec


_SLURM_TIME = r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^UNLIMITED$"


class SlurmConfig(BackendConfig):
    """Where and how the job runs with resources.backend: slurm (the spec's `slurm:` section)."""

    location: ClassVar[str] = "slurm"
    backend: Literal["slurm"] = "slurm"

    partition: str | None = Field(
        default=None, min_length=1, title="Partition", description="Default: the cluster's default partition."
    )
    account: str | None = Field(
        default=None, min_length=1, title="Account", description="sbatch --account; default: the cluster's."
    )
    qos: str | None = Field(
        default=None, min_length=1, title="QOS", description="sbatch --qos; default: the cluster's."
    )
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
    constraint: str | None = Field(
        default=None, min_length=1, title="Constraint", description="Node features (--constraint)."
    )
    gres: str | None = Field(
        default=None, min_length=1, title="GRES", description="Generic resources per node (--gres), e.g. gpu:a100:4."
    )
    exclusive: bool = Field(default=False, title="Exclusive", description="Whole nodes for the job (--exclusive).")
    sbatch_args: list[str] = Field(
        default_factory=list,
        title="Extra sbatch options",
        description="Passed to sbatch as they are, e.g. [--reservation=x].",
    )
    status_host: str | None = Field(
        default=None,
        title="Status host",
        description="Address compute nodes use to reach the orchestrator's status channel (default: "
        "TRAINFLOW_STATUS_HOST, else this machine's address on the route to slurmctld).",
    )


def slurm_config(spec: RunSpec) -> SlurmConfig:
    """The spec's `slurm:` section (a RunSpec whose backend is slurm)."""
    return spec.config_of(SlurmConfig)
