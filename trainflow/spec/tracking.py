"""The spec's `tracking:` section: where the run is recorded."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trainflow.section import Section


class Tracking(Section):
    """Where the run is recorded."""

    uri: str | None = Field(
        default=None, title="MLflow tracking URI", description="Default: sqlite:///$TRAINFLOW_HOME/mlflow.db."
    )
    experiment: str | None = Field(default=None, title="Experiment", description="Default: the spec's name.")
    ui_url: Annotated[str, Field(pattern=r"^https?://")] | None = Field(
        default=None,
        title="MLflow UI address",
        description="Where the links of the run's summary and notifications open MLflow. Default: the tracking "
        "URI when it is an MLflow server, else http://127.0.0.1:5000, where `mlflow ui` serves a local store.",
    )
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
