"""Publish the verdict of a drill, a soak or a rerun where people look: a markdown artifact on the
flow run in Prefect, and tags and a report on the faulted (or rerun) MLflow run. Reporting never
fails the flow that made the verdict (see trainflow/prefect/ui.py)."""

from __future__ import annotations

from prefect.artifacts import create_markdown_artifact

from trainflow.prefect.ui import best_effort
from trainflow.reporting import verdicts
from trainflow.reporting.tracking import Tracker


def _record(summary: dict, tags: dict[str, str], folder: str, report: dict, markdown: str) -> None:
    run, uri = summary.get("mlflow_run_id"), summary.get("tracking_uri")
    if not run or not uri:
        return
    tracker = Tracker(uri)
    tracker.set_tags(run, tags)
    tracker.log_json(run, report, f"{folder}/report.json")
    tracker.log_text(run, markdown, f"{folder}/report.md")


@best_effort
def publish_drill(spec_name: str, report: dict, summary: dict) -> None:
    markdown = verdicts.drill_markdown(report)
    create_markdown_artifact(
        markdown,
        key=verdicts.artifact_key(spec_name, "drill", report["fault"]),
        description=f"drill {report['fault']}: {verdicts.drill_tags(report)['drill_verdict']}",
    )
    _record(summary, verdicts.drill_tags(report), "drill", report, markdown)


@best_effort
def publish_soak(spec_name: str, report: dict, summary: dict, confusion: str) -> None:
    markdown = verdicts.soak_markdown(report, confusion)
    create_markdown_artifact(
        markdown,
        key=verdicts.artifact_key(spec_name, "soak"),
        description=f"soak of {report['faults']} faults: {verdicts.soak_tags(report)['soak_verdict']}",
    )
    _record(summary, verdicts.soak_tags(report), "soak", report, markdown)


@best_effort
def publish_rerun(summary: dict) -> dict:
    """The rerun's verdict (drift or none, parameters equal to the original's or not), published."""
    verdict = verdicts.rerun_verdict(summary)
    markdown = verdicts.rerun_markdown(summary, verdict)
    create_markdown_artifact(
        markdown, key=verdicts.artifact_key("rerun", str(summary.get("rerun_of"))), description=verdict["verdict"]
    )
    _record(
        summary,
        verdicts.rerun_tags(verdict),
        "rerun",
        {
            **verdict,
            "params_sha256": summary.get("params_sha256"),
            "original_params_sha256": summary.get("original_params_sha256"),
        },
        markdown,
    )
    return verdict
