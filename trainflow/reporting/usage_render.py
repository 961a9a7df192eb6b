"""A usage report as people and programs read it: a text table, CSV, JSON and a markdown table
(the Prefect artifact)."""

from __future__ import annotations

import csv
import io
import json

from trainflow.reporting.usage import GroupUsage, UsageReport

CSV_COLUMNS = [
    "group",
    "runs",
    "succeeded",
    "success_rate",
    "device_hours",
    "wasted_device_hours",
    "wasted_share",
    "lost_work_device_hours",
    "detection_device_hours",
    "recovery_device_hours",
    "failures",
    "quota_wait_s",
    "checkpoint_bytes",
    "peak_devices",
    "device_limit",
    "unmeasured_runs",
]


def failures_text(failures: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in failures.items()) or "none"


def _bytes(count: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return str(count)


def _demand(group: GroupUsage) -> str:
    return f"{group.peak_devices}" + (f" / {group.device_limit}" if group.device_limit is not None else "")


def _cells(group: GroupUsage) -> list[str]:
    return [
        group.group,
        str(group.runs),
        f"{group.success_rate:.0%}",
        f"{group.device_hours:.4f}",
        f"{group.wasted_device_hours:.4f} ({group.wasted_share:.0%})",
        f"{group.lost_work_device_hours:.4f} / {group.detection_device_hours:.4f} / {group.recovery_device_hours:.4f}",
        failures_text(group.failures),
        f"{group.quota_wait_s:.0f}",
        _bytes(group.checkpoint_bytes),
        _demand(group),
    ]


HEADERS = [
    "group",
    "runs",
    "success",
    "device-h",
    "wasted device-h",
    "lost / detection / recovery device-h",
    "failures",
    "quota wait s",
    "checkpoints",
    "peak devices / limit",
]


def _limits_note(report: UsageReport) -> str:
    if report.by.value != "team":
        return "team limits: compared with --by team only"
    if not report.limits_checked:
        return "team limits: not compared (no Prefect server reachable at PREFECT_API_URL)"
    return "team limits: trainflow-team-<team> global concurrency limits"


def render_text(report: UsageReport) -> str:
    rows = [HEADERS] + [_cells(g) for g in report.groups] + [_cells(report.total)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = [f"usage by {report.by.value}, last {report.since_s / 86400:g} days, from {report.tracking_uri}"]
    for index, row in enumerate(rows):
        if index == len(rows) - 1:
            lines.append("  ".join("-" * w for w in widths))
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    unmeasured = report.total.unmeasured_runs
    if unmeasured:
        lines.append(f"{unmeasured} run(s) stopped before finalize recorded their device-hours (counted as 0)")
    lines.append(_limits_note(report))
    return "\n".join(lines)


def render_json(report: UsageReport) -> str:
    return json.dumps(report.as_dict())


def render_csv(report: UsageReport) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for group in [*report.groups, report.total]:
        row = group.as_row()
        row["failures"] = ";".join(f"{kind}={count}" for kind, count in group.failures.items())
        row["device_limit"] = "" if group.device_limit is None else group.device_limit
        writer.writerow(row)
    return out.getvalue()


def render_markdown(report: UsageReport) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    total = _cells(report.total)
    total[0] = "**total**"
    lines = [
        f"# Usage by {report.by.value}, last {report.since_s / 86400:g} days",
        "",
        line(HEADERS),
        line(["---"] * len(HEADERS)),
    ]
    lines += [line(_cells(g)) for g in report.groups] + [line(total), "", _limits_note(report) + "."]
    if report.total.unmeasured_runs:
        lines.append(f"{report.total.unmeasured_runs} run(s) stopped before finalize recorded their device-hours.")
    return "\n".join(lines) + "\n"
