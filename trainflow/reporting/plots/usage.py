"""The usage picture: device-hours per group, stacked useful vs wasted, with each group's peak
concurrent demand against its limit in the label (matplotlib's object API on Agg, as render.py)."""

from __future__ import annotations

from pathlib import Path

from trainflow.reporting.plots.data import LOST, PRODUCTIVE
from trainflow.reporting.plots.render import LABEL_BOX, SEGMENT_COLOURS, new_figure, save_png
from trainflow.reporting.usage import UsageReport

USEFUL_COLOUR = SEGMENT_COLOURS[PRODUCTIVE]
WASTED_COLOUR = SEGMENT_COLOURS[LOST]


def _label(group) -> str:
    limit = f" of {group.device_limit}" if group.device_limit is not None else ""
    return f"{group.group}\n{group.runs} run{'s' * (group.runs != 1)}, peak {group.peak_devices}{limit} devices"


def render_usage(report: UsageReport, path: Path | str) -> Path:
    """Write the PNG: one bar per group, useful device-hours below, wasted ones on top."""
    figure = new_figure()
    ax = figure.subplots()
    groups = report.groups
    labels = [_label(g) for g in groups]
    useful = [max(0.0, g.device_hours - g.wasted_device_hours) for g in groups]
    wasted = [g.wasted_device_hours for g in groups]
    positions = range(len(groups))
    ax.bar(positions, useful, color=USEFUL_COLOUR, label="useful device-hours")
    ax.bar(positions, wasted, bottom=useful, color=WASTED_COLOUR, label="wasted (lost work, recovery, stalls)")
    for x, group in zip(positions, groups):
        ax.annotate(
            f"{group.device_hours:.3g} h, {group.wasted_share:.0%} wasted",
            (x, group.device_hours),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            fontsize=9,
            bbox=LABEL_BOX,
        )
    ax.set_ylim(0, max([g.device_hours for g in groups] + [1e-6]) * 1.15)  # room for the labels above the bars
    ax.set_xticks(list(positions), labels, fontsize=9)
    ax.set_ylabel("device-hours")
    ax.set_xlabel(report.by.value)
    days = report.since_s / 86400
    ax.set_title(
        f"Device-hours by {report.by.value}, last {days:g} day{'s' * (days != 1)}: "
        f"{report.total.device_hours:.3g} h in {report.total.runs} runs"
    )
    if not groups:
        ax.text(0.5, 0.5, "no runs in this period", transform=ax.transAxes, ha="center", color="0.4")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize=9, framealpha=0.9)
    return save_png(figure, path)
