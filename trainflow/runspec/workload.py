"""The spec's `workload:` section: what to train."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field, model_validator

from trainflow.section import Section


class WorkloadMode(str, Enum):
    runtime = "runtime"  # the script uses trainflow.runtime: progress, checkpoints, exact resume, ...
    plain = "plain"  # a plain torchrun script: launched and watched by its exits only


# what needs `trainflow.runtime` inside the workers, and a plain script therefore goes without (node
# loss does not: a node's relay heartbeats whatever its ranks run)
RUNTIME_FEATURES = (
    "progress",  # steps, loss and metrics in MLflow; the progress artifact
    "hang_detection",  # no step progress for hang_timeout_s (exits, signals, preemption still count)
    "checkpoints",  # trainflow's checkpoints, restore and exact resume
    "divergence_check",
    "stragglers",
)


class PlainScript(Section):
    """A plain script's own checkpoints: where it writes them and how it is told to resume."""

    checkpoint_dir: str | None = Field(
        default=None,
        title="Checkpoint folder",
        description="The folder the script checkpoints into (relative to its working directory on each node, "
        "or absolute). trainflow copies it to checkpoint.uri, verified like its own checkpoints, and restores "
        "the newest verified copy there on every node before a retry.",
    )
    resume_args: list[str] = Field(
        default_factory=list,
        title="Resume arguments",
        description="Arguments appended to workload.args when a copy was restored (e.g. --init_from=resume).",
    )

    @model_validator(mode="after")
    def _resume_needs_a_folder(self) -> PlainScript:
        if self.resume_args and not self.checkpoint_dir:
            raise ValueError("workload.plain.resume_args needs workload.plain.checkpoint_dir")
        if self.checkpoint_dir is not None and not self.checkpoint_dir.strip():
            raise ValueError("workload.plain.checkpoint_dir is empty")
        return self


class Workload(Section):
    """What to train: the user's script and its arguments."""

    entrypoint: str = Field(
        title="Entrypoint", description="Training script run by every worker (path relative to the working directory)."
    )
    args: list[str] = Field(
        default_factory=list,
        title="Arguments",
        description="Arguments passed to the script; recorded verbatim (spec, MLflow, Prefect), so never a secret.",
    )
    secret_env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list,
        title="Secret environment variables",
        description="Names of environment variables of the orchestrator handed to every worker at launch; "
        "only the names are recorded, never the values.",
    )
    preload: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]] = Field(
        default_factory=list,
        title="Preload",
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
    plain: PlainScript = Field(
        default_factory=PlainScript,
        title="Plain script",
        description="workload.mode: plain only: the script's own checkpoint folder and resume arguments.",
    )

    @model_validator(mode="after")
    def _plain_only(self) -> Workload:
        if self.plain.checkpoint_dir and self.mode != WorkloadMode.plain:
            raise ValueError(
                "workload.plain.checkpoint_dir needs workload.mode: plain (a runtime script "
                "checkpoints through trainflow.runtime)"
            )
        return self

    def features_off(self) -> list[str]:
        """What this workload goes without, as the run records it (MLflow tag and summary `features_off`)."""
        return list(RUNTIME_FEATURES) if self.mode == WorkloadMode.plain else []
