"""The usage report as a Prefect artifact: device-hours, waste, failures, quota waits and checkpoint
bytes per team (or owner, experiment), the same figures as `trainflow usage`, with its picture.

    build the report from MLflow -> compare the teams' limits -> publish a markdown artifact

Deployed weekly as `usage-report` (prefect.yaml); run it directly with `python -m flows.usage_report`.
"""

from __future__ import annotations

import base64
import sys
import tempfile
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.settings import PREFECT_API_URL
from pydantic import Field

from trainflow.home import default_tracking_uri
from trainflow.prefect.rest import PrefectApiError, team_limits
from trainflow.prefect.run_names import given_or
from trainflow.reporting.usage import GroupBy, UsageReport, build_report, compare_limits, parse_since
from trainflow.reporting.usage_render import render_markdown

ARTIFACT_KEY = "usage-report"
EMBED_LIMIT_BYTES = 512 * 1024


@task(name="build-usage-report", cache_policy=NO_CACHE, persist_result=False)
def usage_report_of(tracking_uri: str, by: GroupBy, since: str) -> UsageReport:
    """Sum what the MLflow runs of the period recorded, per group; put each team's limit beside its peak."""
    report = build_report(tracking_uri, by, parse_since(since))
    api = PREFECT_API_URL.value()
    if api and by == GroupBy.team:
        try:
            compare_limits(report, team_limits(api, [g.group for g in report.groups]))
        except PrefectApiError as exc:
            get_run_logger().warning("team limits not compared: %s", exc)
    return report


@task(name="publish-usage-report", cache_policy=NO_CACHE, persist_result=False)
def publish(report: UsageReport) -> str:
    """The markdown table and the picture, as the flow run's `usage-report` artifact."""
    from trainflow.reporting.plots.usage import render_usage

    markdown = render_markdown(report)
    with tempfile.TemporaryDirectory(prefix="trainflow-usage-") as folder:
        picture = render_usage(report, Path(folder) / "usage.png").read_bytes()
    if len(picture) <= EMBED_LIMIT_BYTES:
        markdown += (
            f"\n![Device-hours by {report.by.value}](data:image/png;base64,{base64.b64encode(picture).decode()})\n"
        )
    total = report.total
    create_markdown_artifact(
        markdown,
        key=ARTIFACT_KEY,
        description=f"{total.runs} runs, {total.device_hours:.3f} device-hours, {total.wasted_share:.0%} wasted",
    )
    return markdown


@flow(name="usage-report", flow_run_name=given_or("usage-by-{by}"))
def usage_report(
    by: GroupBy = Field(default=GroupBy.team, title="Group by", description="team, owner or experiment."),
    since: str = Field(
        default="7d",
        pattern=r"^\d+(\.\d+)?[mhdw]$",
        title="Period",
        description="Runs started in this period before now: 7d, 12h, 2w.",
    ),
    tracking_uri: str | None = Field(
        default=None,
        title="MLflow tracking URI",
        description="Where runs are recorded. Default: sqlite:///$TRAINFLOW_HOME/mlflow.db.",
    ),
) -> str:
    """Publish usage and cost per group for the period as a markdown artifact."""
    return publish(usage_report_of(tracking_uri or default_tracking_uri(), GroupBy(by), since))


if __name__ == "__main__":
    print(usage_report(*(sys.argv[1:2] or ["team"])))
