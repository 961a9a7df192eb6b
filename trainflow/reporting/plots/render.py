"""The pictures, drawn with matplotlib's object API on the Agg canvas (no pyplot, no display, no
global backend): safe inside the orchestrator's threads and in a notebook alike.

`draw_*` functions draw onto a Figure or Axes a caller owns (the notebook shows them inline);
`render_*` functions write a PNG and return its path.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from trainflow.contracts.ledger import percent, seconds
from trainflow.reporting.plots.data import (
    DETECTION,
    LOST,
    OTHER,
    PRODUCTIVE,
    RECOVERY,
    STALLS,
    AttemptCurve,
    GoodputBreakdown,
    Timeline,
)

SIZE_IN = (12.0, 5.0)  # at DPI: 1200 x 500 pixels
DPI = 100

OUTCOME_COLOURS = {
    "SUCCEEDED": "#2e7d32",
    "PREEMPTED": "#ef6c00",
    "HUNG": "#6a1b9a",
    "NODE_LOST": "#4e342e",
    "CANCELLED": "#757575",
    "RESIZED": "#1565c0",
}
FAILED_COLOUR = "#c62828"  # every other failure: crashed, killed, diverged, user error, infrastructure
SEGMENT_COLOURS = {
    PRODUCTIVE: "#2e7d32",
    LOST: "#c62828",
    DETECTION: "#ad1457",
    RECOVERY: "#ef6c00",
    STALLS: "#1565c0",
    OTHER: "#9e9e9e",
}
RECOVERY_COLOUR = "#ffb74d"
PROGRESS_COLOUR = "#263238"
CHECKPOINT_COLOUR = "#1565c0"
LABEL_BOX = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8}


def outcome_colour(outcome: str) -> str:
    return OUTCOME_COLOURS.get(outcome, FAILED_COLOUR)


def new_figure() -> Figure:
    figure = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_png(figure: Figure, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=DPI)
    return path


def figure_texts(figure: Figure) -> list[str]:
    """Every text the figure shows (title, labels, annotations, ticks, legends), read back from it."""
    figure.draw_without_rendering()
    found = figure.findobj(lambda artist: hasattr(artist, "get_text") and artist.get_visible())
    return [text for text in (artist.get_text() for artist in found) if text]


def _clock(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# ---- timeline --------------------------------------------------------------------------------


def draw_timeline(figure: Figure, timeline: Timeline) -> tuple[Axes, Axes]:
    """Step progress (top) over the attempts as bars coloured by outcome (bottom), on one clock;
    failure detections as red lines, recoveries as shaded spans, committed checkpoints as diamonds."""
    steps_ax, attempts_ax = figure.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    for ax in (steps_ax, attempts_ax):
        for span in timeline.recoveries:
            ax.axvspan(span.start_s, span.end_s, color=RECOVERY_COLOUR, alpha=0.35, lw=0, zorder=0)
        for attempt in timeline.attempts:
            if attempt.detected_s is not None:
                ax.axvline(attempt.detected_s, color=FAILED_COLOUR, ls="--", lw=1.2, zorder=1)
        ax.grid(axis="x", alpha=0.3)

    attempts_ax.set_xlim(
        left=min(0.0, *(t for t, _ in timeline.progress)) if timeline.progress else 0.0,
        right=max(timeline.wall_s, 1e-3) * 1.01,
    )
    figure.suptitle(timeline.title, fontsize=12)
    attempts_ax.set_xlabel(f"seconds since attempt 1 started ({_clock(timeline.origin)})")
    _draw_progress(steps_ax, timeline)
    _draw_attempts(attempts_ax, timeline)

    legend = [
        Line2D([], [], color=PROGRESS_COLOUR, marker=".", label="last step reported"),
        Line2D([], [], color=CHECKPOINT_COLOUR, marker="D", ls="", label="checkpoint committed"),
    ]
    if any(not c.kept for c in timeline.checkpoints):
        legend.append(
            Line2D(
                [],
                [],
                color=CHECKPOINT_COLOUR,
                marker="D",
                ls="",
                mfc="white",
                label="committed, since removed by retention",
            )
        )
    if any(a.detected_s is not None for a in timeline.attempts):
        legend.append(Line2D([], [], color=FAILED_COLOUR, ls="--", label="failure detected"))
    if timeline.recoveries:
        legend.append(Patch(color=RECOVERY_COLOUR, alpha=0.5, label="recovery"))
    steps_ax.legend(handles=legend, loc="upper left", fontsize=9, framealpha=0.9)
    return steps_ax, attempts_ax


def _draw_progress(ax: Axes, timeline: Timeline) -> None:
    if timeline.progress:
        times, steps = zip(*timeline.progress)
        ax.plot(times, steps, color=PROGRESS_COLOUR, marker=".", ms=3, lw=1.2, drawstyle="steps-post", zorder=3)
    else:
        ax.text(0.5, 0.5, "no per-step metrics recorded", transform=ax.transAxes, ha="center", color="0.4")
    for mark in timeline.checkpoints:
        ax.plot(
            mark.at_s,
            mark.step,
            marker="D",
            ms=7,
            ls="",
            color=CHECKPOINT_COLOUR,
            mfc=CHECKPOINT_COLOUR if mark.kept else "white",
            zorder=4,
        )
        ax.annotate(
            f"ckpt {mark.step}",
            (mark.at_s, mark.step),
            xytext=(8, -3),
            textcoords="offset points",
            fontsize=8,
            color=CHECKPOINT_COLOUR,
            bbox=LABEL_BOX,
        )
    for span in timeline.recoveries:
        ax.annotate(
            f"recovery {seconds(span.seconds)}",
            ((span.start_s + span.end_s) / 2, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -14),
            textcoords="offset points",
            ha="center",
            fontsize=9,
            color="#e65100",
        )
    top = max([s for _, s in timeline.progress] + [a.last_step for a in timeline.attempts] + [1])
    ax.set_ylim(0, top * 1.12)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("training step")


def _draw_attempts(ax: Axes, timeline: Timeline) -> None:
    pad = timeline.wall_s * 0.005
    ax.set_yticks(range(len(timeline.attempts)), [f"attempt {a.attempt}" for a in timeline.attempts])
    ax.set_ylim(len(timeline.attempts) - 0.4, -0.6)  # attempt 1 on top
    ax.set_ylabel("attempt")
    ax.figure.draw_without_rendering()  # settle the layout: the labels below are measured against it
    for row, attempt in enumerate(timeline.attempts):
        colour = outcome_colour(attempt.outcome)
        width = max(attempt.end_s - attempt.start_s, timeline.wall_s * 0.002)
        ax.barh(row, width, left=attempt.start_s, height=0.6, color=colour, alpha=0.85, zorder=2)
        if attempt.detected_s is not None:
            ax.plot(attempt.detected_s, row, marker="X", ms=10, color=FAILED_COLOUR, mec="white", zorder=4)
        label = ax.text(
            attempt.start_s + pad,
            row,
            attempt.label,
            va="center",
            ha="left",
            fontsize=9,
            color="white",
            fontweight="bold",
            zorder=3,
        )
        # inside the bar, before the failure marker, when it fits; else just after the bar
        room_until = attempt.detected_s if attempt.detected_s is not None else attempt.start_s + width
        if not _fits(ax, label, attempt.start_s + pad, room_until - pad):
            after = attempt.start_s + width + pad
            if _fits(ax, label, after, ax.get_xlim()[1]):
                label.set(x=after, color=colour)
            else:  # a short attempt at the end of the run: before the bar
                label.set(x=attempt.start_s - pad, ha="right", color=colour)


def _fits(ax: Axes, label, start: float, end: float) -> bool:
    """Whether a text drawn from x=start ends before x=end (measured as the figure would draw it)."""
    renderer = ax.figure.canvas.get_renderer()
    text_px = label.get_window_extent(renderer).width
    span_px = ax.transData.transform((end, 0))[0] - ax.transData.transform((start, 0))[0]
    return text_px * 1.05 < span_px


def render_timeline(timeline: Timeline, path: Path | str) -> Path:
    figure = new_figure()
    draw_timeline(figure, timeline)
    return save_png(figure, path)


# ---- goodput ---------------------------------------------------------------------------------


def draw_goodput(figure: Figure, breakdown: GoodputBreakdown) -> tuple[Axes, Axes]:
    """The wall time as one stacked bar (top) and each part with its seconds and share (bottom)."""
    share_ax, parts_ax = figure.subplots(2, 1, height_ratios=[1, 3])
    wall = breakdown.wall_s or 1.0
    starts = [sum(s.seconds for s in breakdown.segments[:i]) for i in range(len(breakdown.segments))]
    for left, segment in zip(starts, breakdown.segments):
        share_ax.barh(0, segment.seconds, left=left, color=SEGMENT_COLOURS[segment.label], height=0.8)
    share_ax.set_xlim(0, max(wall, sum(s.seconds for s in breakdown.segments)))
    share_ax.set_yticks([])
    share_ax.set_xlabel("seconds of wall time (first attempt's start to last attempt's end)")

    labels = [s.label for s in breakdown.segments]
    values = [s.seconds for s in breakdown.segments]
    rows = range(len(labels))
    parts_ax.barh(rows, values, color=[SEGMENT_COLOURS[label] for label in labels], height=0.65)
    parts_ax.set_yticks(rows, labels)
    parts_ax.invert_yaxis()
    biggest = max(values + [1e-9])
    for row, segment in zip(rows, breakdown.segments):
        parts_ax.text(segment.seconds + biggest * 0.01, row, segment.figures, va="center", fontsize=10)
    parts_ax.set_xlim(0, biggest * 1.22)
    parts_ax.set_xlabel("seconds")
    parts_ax.grid(axis="x", alpha=0.3)

    figure.suptitle(breakdown.title, fontsize=12)

    figure.draw_without_rendering()  # settle the layout: the labels below are measured against it
    for left, segment in zip(starts, breakdown.segments):  # names where they fit, else the share, else nothing
        label = share_ax.text(
            left + segment.seconds / 2,
            0,
            f"{segment.label}\n{percent(segment.share)}",
            ha="center",
            va="center",
            fontsize=9,
            color="white",
            fontweight="bold",
        )
        if not _fits(share_ax, label, left, left + segment.seconds):
            label.set_text(percent(segment.share))
            if not _fits(share_ax, label, left, left + segment.seconds):
                label.remove()
    return share_ax, parts_ax


def render_goodput(breakdown: GoodputBreakdown, path: Path | str) -> Path:
    figure = new_figure()
    draw_goodput(figure, breakdown)
    return save_png(figure, path)


# ---- for the notebook ------------------------------------------------------------------------


def draw_curves_by_attempt(ax: Axes, curves: list[AttemptCurve], metric: str = "loss", title: str = "") -> Axes:
    """A per-step metric, one line per attempt coloured by its outcome, a vertical line where an attempt failed."""
    for curve in curves:
        colour = outcome_colour(curve.outcome)
        if curve.steps:
            ax.plot(
                curve.steps,
                curve.values,
                color=colour,
                lw=1.4,
                marker="." if len(curve.steps) < 60 else None,
                label=f"attempt {curve.attempt} ({curve.outcome})",
            )
        if curve.failed_at_step is not None:
            ax.axvline(curve.failed_at_step, color=colour, ls="--", lw=1.2)
            ax.annotate(
                f"attempt {curve.attempt}: {curve.outcome} at step {curve.failed_at_step}",
                (curve.failed_at_step, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-4, -12),
                textcoords="offset points",
                ha="right",
                fontsize=8,
                color=colour,
                bbox=LABEL_BOX,
            )
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    if title:
        ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return ax


def draw_checkpoint_timings(ax: Axes, timings: dict[int, dict[str, float]], title: str = "") -> Axes:
    """Per committed checkpoint, the seconds of each phase as a stacked bar."""
    phases = ["stage_s", "save_s", "hash_s", "upload_s", "commit_s"]
    colours = ["#1565c0", "#42a5f5", "#90caf9", "#ef6c00", "#2e7d32"]
    steps = list(timings)
    bottom = [0.0] * len(steps)
    for phase, colour in zip(phases, colours):
        values = [timings[step].get(phase, 0.0) for step in steps]
        if any(values):
            ax.bar([str(s) for s in steps], values, bottom=bottom, color=colour, label=phase.removesuffix("_s"))
            bottom = [b + v for b, v in zip(bottom, values)]
    if not steps:
        ax.text(0.5, 0.5, "no committed checkpoint", transform=ax.transAxes, ha="center", color="0.4")
    ax.set_xlabel("checkpoint step")
    ax.set_ylabel("seconds")
    if title:
        ax.set_title(title, fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    if steps:
        ax.set_ylim(0, max(bottom) * 1.45)  # room for the legend above the bars
        ax.legend(fontsize=8, ncols=3, loc="upper center")
    return ax
