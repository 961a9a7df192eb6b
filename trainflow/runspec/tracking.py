"""The spec's `tracking:` section: where the run is recorded."""

from __future__ import annotations

import posixpath
import re
import unicodedata
from typing import Annotated

from pydantic import Field, field_validator

from trainflow.section import Section

# MLflow's own limits (mlflow.utils.validation): a longer name fails only when the run starts.
MAX_EXPERIMENT_NAME_LENGTH = 500
MAX_TAG_KEY_LENGTH = 250
TAG_NAME = re.compile(r"^[/\w.\- :]+$")

# Tags trainflow writes itself: lineage, identity, outcome and audit. A spec setting one could forge
# what a run is (a rerun of another, an attempt of another run, someone else's launch), so none is
# the spec's to set. `team` and `owner` are the user's.
RESERVED_TAG_PREFIXES = ("mlflow.", "trainflow.", "trainflow_", "image_", "rerun_", "launched_", "workload_git_")
RESERVED_TAGS = frozenset(
    {
        "spec_hash",
        "prefect_flow_run_id",
        "prefect_deployment",
        "resume",
        "workload_mode",
        "features_off",
        "workload_sha256",
        "git_diff_sha256",
        "lock_sha256",
        "platform",
        "env_fingerprint",
        "git_commit",
        "git_dirty",
        "python_version",
        "torch_version",
        "status",
        "reason",
        "params_sha256",
        "teardown_clean",
        "layout_warnings",
        "attempt",
        "outcome",
    }
)


def reserved_tag(name: str) -> bool:
    """A tag trainflow writes itself, which a spec may not set."""
    return name.lower() in RESERVED_TAGS or name.lower().startswith(RESERVED_TAG_PREFIXES)


class Tracking(Section):
    """Where the run is recorded."""

    uri: str | None = Field(
        default=None, title="MLflow tracking URI", description="Default: sqlite:///$TRAINFLOW_HOME/mlflow.db."
    )
    experiment: str | None = Field(
        default=None,
        title="Experiment",
        description="Default: the spec's name. At most 500 characters; no path separators, control characters or '..'.",
    )
    ui_url: Annotated[str, Field(pattern=r"^https?://")] | None = Field(
        default=None,
        title="MLflow UI address",
        description="Where the links of the run's summary and notifications open MLflow. Default: the tracking "
        "URI when it is an MLflow server, else http://127.0.0.1:5000, where `mlflow ui` serves a local store.",
    )
    tags: dict[str, str] = Field(
        default_factory=dict,
        title="Tags",
        description="Extra MLflow tags, e.g. owner and team, so device-hours can be attributed. "
        "Tags trainflow writes itself (mlflow.*, trainflow.*, spec_hash, rerun_of, status, ...) are refused.",
    )
    store_patience_s: Annotated[float, Field(ge=1, le=86400)] = Field(
        default=120.0,
        title="Tracking store patience (s)",
        description="How long the tracking store may refuse writes (locked, disk full, unreachable) while "
        "training goes on and the writes are retried; past it the attempt is stopped with an emergency "
        "checkpoint and the run ends INFRA.",
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
    max_node_log_mb: Annotated[float, Field(gt=0, le=1_000_000)] = Field(
        default=32,
        title="Node log bound (MiB)",
        description="What each node's log keeps of an attempt's output (its ranks' stdout and stderr, its "
        "agent's): the first and the last half of this, with a line saying how much was dropped between "
        "them; on disk during the run and in MLflow (local backend).",
    )

    @field_validator("experiment")
    @classmethod
    def _experiment_is_a_name(cls, name: str | None) -> str | None:
        if name is None:
            return name
        if not name.strip():
            raise ValueError("an experiment name cannot be empty")
        if len(name) > MAX_EXPERIMENT_NAME_LENGTH:
            raise ValueError(f"{len(name)} characters; MLflow takes at most {MAX_EXPERIMENT_NAME_LENGTH}")
        if "/" in name or "\\" in name:
            raise ValueError("a name, not a path: no '/' or '\\'")
        if ".." in name:
            raise ValueError("a name, not a path: no '..'")
        if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
            raise ValueError("no control characters")
        return name

    @field_validator("tags")
    @classmethod
    def _tags_are_the_users(cls, tags: dict[str, str]) -> dict[str, str]:
        reserved = sorted(name for name in tags if reserved_tag(name))
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)}: reserved (trainflow records {'it' if len(reserved) == 1 else 'them'} "
                "itself); choose another tag name"
            )
        for name in tags:
            if not name.strip() or len(name) > MAX_TAG_KEY_LENGTH:
                raise ValueError(f"{name[:40]!r}: a tag name has 1 to {MAX_TAG_KEY_LENGTH} characters")
            if not TAG_NAME.match(name) or posixpath.normpath(name) != name or name.startswith(("/", "..")):
                raise ValueError(
                    f"{name!r}: a tag name has letters, digits, '_', '-', '.', ' ', ':' and '/' (not leading, "
                    "doubled or trailing)"
                )
        return tags
