"""The spec's `workload:` section: what to train."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field

from trainflow.section import Section


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
    preload: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]] = Field(
        default_factory=list, title="Preload",
        description="Modules warm workers import ahead, besides torch, the runtime and the installed packages "
        "the script imports at its top level (found by reading it).",
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
