"""What the pictures show, as plain numbers and the words they print: shaped from a run summary
(the `--json` contract, whose figures are the run ledger's) and the run's MLflow metric histories,
with no MLflow or matplotlib in sight, so tests can feed it directly. Every figure a picture
prints is the ledger's, printed as the ledger prints it (see trainflow/contracts/ledger.py); the
histories only place points on the timeline's clock.

A metric history is a list of `(step, value, unix seconds)`; the keys are MLflow metric names
(`step_time_s`, `loss`, `checkpoint_bytes`, `checkpoint_stall_s`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.contracts import RunSummary
from trainflow.contracts.ledger import (
    DETECTION,
    LOST,
    OTHER,
    PRODUCTIVE,
    RECOVERY,
    STALLS,
    RunLedger,
    milliseconds,
    percent,
    seconds,
)

MetricPoint = tuple[int, float, float]  # step, value, unix time in seconds
Histories = dict[str, list[MetricPoint]]

# the metrics the pictures read; MLflow stores timestamps in milliseconds, the shapes use seconds
PROGRESS_KEYS = ("step_time_s", "loss")  # any metric rank 0 reports every step gives step -> time
CHECKPOINT_TIMINGS = ("stage_s", "save_s", "hash_s", "upload_s", "commit_s")
PLOT_METRICS = (
    "loss",
    "step_time_s",
    "checkpoint_bytes",
    "checkpoint_stall_s",
    *(f"checkpoint_{name}" for name in CHECKPOINT_TIMINGS),
)


@dataclass(frozen=True, slots=True)
class AttemptSpan:
    """One attempt on the run's clock (seconds since the first attempt started)."""

    attempt: int
    outcome: str
    start_s: float
    end_s: float
    detected_s: float | None  # when the orchestrator noticed the failure; None for a success
    resumed_from_step: int
    last_step: int
    lost_steps: int
    steps_run: int  # the steps rank 0 ran in this attempt
    step_time_s: float  # their summed step time

    @property
    def label(self) -> str:
        text = f"{self.outcome}: steps {self.resumed_from_step} to {self.last_step}"
        if self.lost_steps:
            text += f", {self.lost_steps} lost"
        if self.steps_run:
            text += f" ({self.steps_run} steps, {seconds(self.step_time_s)} of step time)"
        return text


@dataclass(frozen=True, slots=True)
class RecoverySpan:
    """From a failure's detection to the first training step of the attempt that followed."""

    attempt: int  # the attempt that recovered
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    step: int
    at_s: float  # when the snapshot was committed (or, without a commit time, when the step was reached)
    kept: bool  # still in the store after retention


@dataclass(frozen=True, slots=True)
class Timeline:
    """Everything the timeline picture draws for one lifecycle run."""

    run_id: str
    mlflow_run_id: str
    status: str
    origin: float  # unix time of 0 s: the first attempt's start
    wall_s: float
    attempts: tuple[AttemptSpan, ...]
    recoveries: tuple[RecoverySpan, ...]
    checkpoints: tuple[CheckpointMark, ...]
    progress: tuple[tuple[float, int], ...]  # (seconds, step) in time order; a retry shows as a drop

    @property
    def title(self) -> str:
        attempts = len(self.attempts)
        return (
            f"Run {self.run_id}{_mlflow(self.mlflow_run_id)}: {self.status or 'unfinished'}, "
            f"{attempts} attempt{'s' * (attempts != 1)} in {seconds(self.wall_s)}"
        )


@dataclass(frozen=True, slots=True)
class Segment:
    label: str
    seconds: float
    share: float  # of the wall time

    @property
    def figures(self) -> str:
        """Its seconds and share, as the parts' bars print them."""
        return f"{seconds(self.seconds)}  ({percent(self.share)})"


@dataclass(frozen=True, slots=True)
class GoodputBreakdown:
    """Where the wall time of the attempts went; the segments add up to `wall_s`."""

    run_id: str
    mlflow_run_id: str
    wall_s: float
    mean_step_s: float | None  # None when no step reported a time
    goodput: float | None  # the ledger's: productive training over wall time
    segments: tuple[Segment, ...]

    def seconds(self, label: str) -> float:
        return next(s.seconds for s in self.segments if s.label == label)

    @property
    def title(self) -> str:
        step = "" if self.mean_step_s is None else f", mean step {milliseconds(self.mean_step_s)}"
        return (
            f"Run {self.run_id}{_mlflow(self.mlflow_run_id)}: goodput {percent(self.goodput)} of "
            f"{seconds(self.wall_s)}{step}"
        )


SEGMENTS = (PRODUCTIVE, LOST, DETECTION, RECOVERY, STALLS, OTHER)


def _mlflow(run_id: str) -> str:
    return f" (MLflow {run_id})" if run_id else ""


def as_summary(summary: RunSummary | dict) -> RunSummary:
    summary = summary if isinstance(summary, RunSummary) else RunSummary.model_validate(summary)
    if not summary.attempts:
        raise ValueError(f"run {summary.run_id}: the summary has no attempts to draw")
    return summary


def progress_points(histories: Histories) -> list[tuple[float, int]]:
    """(unix seconds, step) of every reported step in time order, from the first per-step metric present."""
    for key in PROGRESS_KEYS:
        if histories.get(key):
            return sorted((t, int(step)) for step, _, t in histories[key])
    return []


def timeline_data(summary: RunSummary | dict, histories: Histories) -> Timeline:
    """Attempts as spans, failure detections, recovery spans, checkpoint commits and step progress,
    on one clock that starts when the first attempt started."""
    summary = as_summary(summary)
    attempts = summary.attempts
    origin = attempts[0].started_at
    spans = [
        AttemptSpan(
            attempt=a.attempt,
            outcome=a.outcome.value,
            start_s=a.started_at - origin,
            end_s=a.ended_at - origin,
            detected_s=None if a.detected_at is None else a.detected_at - origin,
            resumed_from_step=a.resumed_from_step,
            last_step=a.last_step,
            lost_steps=a.lost_steps,
            steps_run=a.steps_run,
            step_time_s=a.step_time_s,
        )
        for a in attempts
    ]
    recoveries = [
        RecoverySpan(attempt.attempt, previous.detected_s, previous.detected_s + row.recovery_s)
        for previous, attempt, row in zip(spans, spans[1:], attempts[1:])
        if row.recovery_s is not None and previous.detected_s is not None
    ]

    progress = [(t - origin, step) for t, step in progress_points(histories)]
    kept = {c.step for c in summary.checkpoints}
    committed: dict[int, float] = {}
    for step, _, t in histories.get("checkpoint_bytes") or []:
        committed.setdefault(int(step), t - origin)  # a step committed once; a later attempt never rewrites it
    for step in kept - committed.keys():  # kept, but its commit time was not recorded: when the step was reached
        reached = [t for t, s in progress if s == step]
        if reached:
            committed[step] = reached[-1]
    checkpoints = tuple(CheckpointMark(step, at, step in kept) for step, at in sorted(committed.items()))

    return Timeline(
        run_id=summary.run_id,
        mlflow_run_id=summary.mlflow_run_id,
        status=summary.status,
        origin=origin,
        wall_s=summary.costs.wall_s,
        attempts=tuple(spans),
        recoveries=tuple(recoveries),
        checkpoints=checkpoints,
        progress=tuple(progress),
    )


def goodput_breakdown(summary: RunSummary | dict) -> GoodputBreakdown:
    """The ledger's split of the attempts' wall time: productive training, lost work, failure
    detection, recovery, checkpoint stalls and the rest."""
    summary = as_summary(summary)
    ledger = RunLedger(attempts=summary.attempts, figures=summary.costs)
    figures = summary.costs
    return GoodputBreakdown(
        run_id=summary.run_id,
        mlflow_run_id=summary.mlflow_run_id,
        wall_s=figures.wall_s,
        mean_step_s=figures.mean_step_time_s if figures.steps_run else None,
        goodput=figures.goodput,
        segments=tuple(Segment(label, value, share) for label, value, share in ledger.segments()),
    )


@dataclass(frozen=True, slots=True)
class AttemptCurve:
    """One attempt's share of a per-step metric."""

    attempt: int
    outcome: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    failed_at_step: int | None  # the last step a failed attempt reached


def curves_by_attempt(summary: RunSummary | dict, history: list[MetricPoint]) -> list[AttemptCurve]:
    """Split a per-step metric (loss, step time) by the attempt that reported it, by time: a retry
    re-runs steps after its checkpoint, so the same step can appear once per attempt."""
    attempts = as_summary(summary).attempts
    curves = []
    for index, a in enumerate(attempts):
        following = attempts[index + 1].started_at if index + 1 < len(attempts) else float("inf")
        points = sorted((step, value) for step, value, t in history if a.started_at <= t < following)
        curves.append(
            AttemptCurve(
                attempt=a.attempt,
                outcome=a.outcome.value,
                steps=tuple(step for step, _ in points),
                values=tuple(value for _, value in points),
                failed_at_step=None if a.outcome.value == "SUCCEEDED" else a.last_step,
            )
        )
    return curves


def checkpoint_timings(histories: Histories) -> dict[int, dict[str, float]]:
    """Per committed step: stage, save, hash, upload and commit seconds (those reported)."""
    table: dict[int, dict[str, float]] = {}
    for name in CHECKPOINT_TIMINGS:
        for step, value, _ in histories.get(f"checkpoint_{name}") or []:
            table.setdefault(int(step), {})[name] = value
    committed = {int(step) for step, _, _ in histories.get("checkpoint_bytes") or []}
    return {step: row for step, row in sorted(table.items()) if not committed or step in committed}
