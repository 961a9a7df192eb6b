"""The verdicts of a drill, a soak and a rerun as a person reads them: a markdown table for the
Prefect UI, and the MLflow tags that say the same at a glance in the runs list."""

from __future__ import annotations

import json
import re

PASSED, FAILED = "PASSED", "FAILED"


def cell(value) -> str:
    """A table cell: text as it is, anything else as compact JSON, never breaking the table."""
    if value is None:
        return "–"
    text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(", ", ": "))
    return text.replace("|", "\\|").replace("\n", " ") or "–"


def table(rows: dict) -> list[str]:
    return ["| | |", "|---|---|", *(f"| {key} | {cell(value)} |" for key, value in rows.items())]


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) from names that may hold others."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def drill_markdown(report: dict) -> str:
    verdict = PASSED if report.get("passed") else FAILED
    lines = [f"# Drill {report.get('fault')}: {verdict}", ""]
    if report.get("broken_rules"):
        lines += ["## Broken rules", "", *(f"- {rule}" for rule in report["broken_rules"]), ""]
    return "\n".join(lines + table({k: v for k, v in report.items() if k not in ("passed", "broken_rules")})) + "\n"


def drill_tags(report: dict) -> dict[str, str]:
    return {
        "drill_fault": str(report.get("fault")),
        "drill_verdict": PASSED if report.get("passed") else FAILED,
        "drill_params_match_baseline": str(bool(report.get("params_match_baseline"))).lower(),
    }


def soak_markdown(report: dict, confusion: str) -> str:
    verdict = PASSED if report.get("passed") else FAILED
    lines = [f"# Soak of {report.get('faults')} faults: {verdict}", "", "```", confusion, "```", ""]
    if report.get("per_fault"):
        lines += [
            "## Faults",
            "",
            "| Kind | Attempt | At step | Injected at | Detected | Expected | Lost steps |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {cell(f.get('kind'))} | {cell(f.get('attempt'))} | {cell(f.get('at_step'))} | "
            f"{cell(f.get('injected_at_step'))} | {cell(f.get('detected'))} | {cell(f.get('expected'))} | "
            f"{cell(f.get('lost_steps'))} |"
            for f in report["per_fault"]
        ]
        lines.append("")
    rest = {k: v for k, v in report.items() if k not in ("passed", "per_fault", "confusion")}
    return "\n".join(lines + table(rest)) + "\n"


def soak_tags(report: dict) -> dict[str, str]:
    return {
        "soak_faults": str(report.get("faults")),
        "soak_verdict": PASSED if report.get("passed") else FAILED,
        "soak_params_match_baseline": str(bool(report.get("params_match_baseline"))).lower(),
    }


def rerun_verdict(summary: dict) -> dict:
    """Drift or none, and whether the rerun's final parameters are the original's, bit for bit."""
    drift, ours, original = (
        summary.get("drift") or [],
        summary.get("params_sha256"),
        summary.get("original_params_sha256"),
    )
    match = ours is not None and ours == original
    if ours is None or original is None:
        params = f"params_sha256 not comparable (rerun {ours or 'none'}, original {original or 'none'})"
    else:
        params = f"params_sha256 {ours} {'=' if match else '≠'} the original's" + ("" if match else f" ({original})")
    return {
        "rerun_of": summary.get("rerun_of"),
        "drift": drift,
        "params_match_original": match,
        "verdict": ("no drift" if not drift else f"drift: {'; '.join(drift)}") + f"; {params}",
    }


def rerun_markdown(summary: dict, verdict: dict) -> str:
    rows = {
        "Verdict": verdict["verdict"],
        "Status": summary.get("status"),
        "Rerun of (MLflow run)": verdict["rerun_of"],
        "This run (MLflow run)": summary.get("mlflow_run_id"),
        "Drift": "none" if not verdict["drift"] else verdict["drift"],
        "params_sha256": summary.get("params_sha256"),
        "Original params_sha256": summary.get("original_params_sha256"),
        "Parameters match the original": verdict["params_match_original"],
    }
    return "\n".join([f"# Rerun of {verdict['rerun_of']}", ""] + table(rows)) + "\n"


def rerun_tags(verdict: dict) -> dict[str, str]:
    """Beside `rerun_of` and `rerun_drift`, which the rerun's run carries from its start."""
    return {
        "rerun_verdict": verdict["verdict"][:5000],
        "rerun_params_match_original": str(verdict["params_match_original"]).lower(),
    }
