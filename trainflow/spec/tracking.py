"""The spec's `tracking:` section: where the run is recorded."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trainflow.section import Section


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
    max_node_log_mb: Annotated[float, Field(gt=0, le=1_000_000)] = Field(
        default=32,
        title="Node log bound (MiB)",
        description="What each node's log keeps of an attempt's output (its ranks' stdout and stderr, its "
        "agent's): the first and the last half of this, with a line saying how much was dropped between "
        "them; on disk during the run and in MLflow (local backend).",
    )
