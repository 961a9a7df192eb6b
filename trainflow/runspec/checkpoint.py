"""The spec's `checkpoint:` section: where and how often the training state is saved."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from trainflow.checkpoint.location import S3Location, is_remote, is_s3
from trainflow.section import Section

_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def checkpoint_uri_problem(uri: str) -> str | None:
    """Why `uri` is neither a local path, file://PATH nor s3://bucket[/prefix]; None when it is one."""
    supported = "use a local path, file:///absolute/path or s3://bucket/prefix"
    if uri.lower().startswith("s3:") and not uri.startswith("s3://"):
        return f"{uri!r} is not an S3 URI: write s3://bucket/prefix (lowercase s3, two slashes)"
    if is_s3(uri):
        bucket = S3Location.parse(uri).bucket
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
    buddy_copies: bool = Field(
        default=True,
        title="Buddy copies",
        description="Also keep each node's files of a local checkpoint on the next node, so a lost node's "
        "state survives it: the job resumes from the newest local checkpoint, not the newest snapshot.",
    )
    memory_every_steps: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        default=None,
        title="In-memory copy every N steps",
        description="With fault_tolerance.in_process_restart: how often each rank copies its state into its "
        "node's shared memory (and at every checkpoint), the state an in-process restart goes back to "
        "(default: every step while the copy costs at most 2% of the step time, else as often as that allows).",
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
    def is_remote(self) -> bool:
        """The store is off this machine and shared by every node (trainflow.checkpoint.location)."""
        return is_remote(self.uri)
