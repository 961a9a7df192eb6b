"""What the pictures show, as plain numbers: shaped from a run summary (the `--json` contract) and
the run's MLflow metric histories, with no MLflow or matplotlib in sight, so tests can feed it
directly.

A metric history is a list of `(step, value, unix seconds)`; the keys are MLflow metric names
(`step_time_s`, `loss`, `checkpoint_bytes`, `checkpoint_stall_s`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

MetricPoint = tuple[int, float, float]  # step, value, unix time in seconds
Histories = dict[str, list[MetricPoint]]

# the metrics the pictures read; MLflow stores timestamps in milliseconds, the shapes use seconds
PROGRESS_KEYS = ("step_time_s", "loss")  # any metric rank 0 reports every step gives step -> time
CHECKPOINT_TIMINGS = ("stage_s", "save_s", "hash_s", "upload_s", "commit_s")
PLOT_METRICS = (
    "loss", "step_time_s", "checkpoint_bytes", "checkpoint_stall_s",
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


@dataclass(frozen=True, slots=True)
class Segment:
    label: str
    seconds: float


@dataclass(frozen=True, slots=True)
class GoodputBreakdown:
    """Where the wall time of the attempts went; the segments add up to `wall_s`."""

    run_id: str
    mlflow_run_id: str
    wall_s: float
    mean_step_s: float | None
    goodput: float | None  # the summary's figure: productive training over wall time
    segments: tuple[Segment, ...]

    def seconds(self, label: str) -> float:
        return next(s.seconds for s in self.segments if s.label == label)


PRODUCTIVE = "productive training"
LOST = "lost work (steps redone)"
DETECTION = "failure detection"
RECOVERY = "recovery (detection to next step)"
STALLS = "checkpoint stalls"
OTHER = "startup, shutdown and other"
SEGMENTS = (PRODUCTIVE, LOST, DETECTION, RECOVERY, STALLS, OTHER)


def _attempts(summary: dict) -> list[dict]:
    attempts = summary.get("attempts") or []
    if not attempts:
        raise ValueError(f"run {summary.get('run_id')}: the summary has no attempts to draw")
    return attempts


def progress_points(histories: Histories) -> list[tuple[float, int]]:
    """(unix seconds, step) of every reported step in time order, from the first per-step metric present."""
    for key in PROGRESS_KEYS:
        if histories.get(key):
            return sorted((t, int(step)) for step, _, t in histories[key])
    return []


def timeline_data(summary: dict, histories: Histories) -> Timeline:
    """Attempts as spans, failure detections, recovery spans, checkpoint commits and step progress,
    on one clock that starts when the first attempt started."""
    attempts = _attempts(summary)
    origin = attempts[0]["started_at"]
    spans = [
        AttemptSpan(
            attempt=a["attempt"],
            outcome=a["outcome"],
            start_s=a["started_at"] - origin,
            end_s=a["ended_at"] - origin,
            detected_s=None if a.get("detected_at") is None else a["detected_at"] - origin,
            resumed_from_step=a["resumed_from_step"],
            last_step=a.get("last_step", a["resumed_from_step"]),
            lost_steps=a.get("lost_steps") or 0,
        )
        for a in attempts
    ]
    recoveries = []
    for previous, attempt in zip(spans, spans[1:]):
        row = next(a for a in attempts if a["attempt"] == attempt.attempt)
        if row.get("recovery_s") is not None and previous.detected_s is not None:
            end = previous.detected_s + row["recovery_s"]
            recoveries.append(RecoverySpan(attempt.attempt, previous.detected_s, end))

    progress = [(t - origin, step) for t, step in progress_points(histories)]
    kept = {c["step"] for c in summary.get("checkpoints") or []}
    committed: dict[int, float] = {}
    for step, _, t in histories.get("checkpoint_bytes") or []:
        committed.setdefault(int(step), t - origin)  # a step committed once; a later attempt never rewrites it
    for step in kept - committed.keys():  # kept, but its commit time was not recorded: when the step was reached
        reached = [t for t, s in progress if s == step]
        if reached:
            committed[step] = reached[-1]
    checkpoints = tuple(CheckpointMark(step, at, step in kept) for step, at in sorted(committed.items()))

    return Timeline(
        run_id=summary.get("run_id") or summary.get("mlflow_run_id") or "run",
        mlflow_run_id=summary.get("mlflow_run_id") or "",
        status=summary.get("status") or "",
        origin=origin,
        wall_s=attempts[-1]["ended_at"] - origin,
        attempts=tuple(spans),
        recoveries=tuple(recoveries),
        checkpoints=checkpoints,
        progress=tuple(progress),
    )


def reported_while_training(points: list[MetricPoint], attempts: list[dict]) -> list[MetricPoint]:
    """The points a worker reported while an attempt ran; a figure the orchestrator logs for the
    whole run afterwards (finalize, stamped with the last attempt's end) under the same name is not one."""
    return [p for p in points if any(a["started_at"] <= p[2] < a["ended_at"] - 0.001 for a in attempts)]


def checkpoint_stall_s(histories: Histories, attempts: list[dict]) -> float:
    """Time training waited for checkpoints: the runtime's own `checkpoint_stall_s` per save when it
    reports it, else the committed snapshots' staging time. Writing, hashing and uploading run in
    the background while training goes on, so they are not stalls."""
    stalls = reported_while_training(histories.get("checkpoint_stall_s") or [], attempts)
    if stalls:
        return sum(value for _, value, _ in stalls)
    return sum(row.get("stage_s", 0.0) for row in checkpoint_timings(histories).values())


def goodput_breakdown(summary: dict, histories: Histories) -> GoodputBreakdown:
    """Split the attempts' wall time (first start to last end, as the summary's goodput does) into
    productive training, lost work, failure detection, recovery, checkpoint stalls and the rest."""
    attempts = _attempts(summary)
    wall = max(0.0, attempts[-1]["ended_at"] - attempts[0]["started_at"])
    step_times = [value for _, value, _ in histories.get("step_time_s") or []]
    mean_step = fmean(step_times) if step_times else None
    useful_steps = max(0, (summary.get("final_step") or 0) - attempts[0]["resumed_from_step"])
    if mean_step is not None:
        productive = useful_steps * mean_step
    else:  # no per-step times recorded: the summary's goodput is the same ratio
        productive = (summary.get("goodput") or 0.0) * wall
    lost = sum(a.get("lost_steps") or 0 for a in attempts) * (mean_step or 0.0)
    detection = sum(a.get("detection_latency_s") or 0.0 for a in attempts if a["outcome"] != "SUCCEEDED")
    recovery = sum(a.get("recovery_s") or 0.0 for a in attempts)
    stalls = checkpoint_stall_s(histories, attempts)
    accounted = productive + lost + detection + recovery + stalls
    segments = (
        Segment(PRODUCTIVE, productive),
        Segment(LOST, lost),
        Segment(DETECTION, detection),
        Segment(RECOVERY, recovery),
        Segment(STALLS, stalls),
        Segment(OTHER, max(0.0, wall - accounted)),
    )
    return GoodputBreakdown(
        run_id=summary.get("run_id") or summary.get("mlflow_run_id") or "run",
        mlflow_run_id=summary.get("mlflow_run_id") or "",
        wall_s=max(wall, accounted),
        mean_step_s=mean_step,
        goodput=summary.get("goodput"),
        segments=segments,
    )


@dataclass(frozen=True, slots=True)
class AttemptCurve:
    """One attempt's share of a per-step metric."""

    attempt: int
    outcome: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    failed_at_step: int | None  # the last step a failed attempt reached


def curves_by_attempt(summary: dict, history: list[MetricPoint]) -> list[AttemptCurve]:
    """Split a per-step metric (loss, step time) by the attempt that reported it, by time: a retry
    re-runs steps after its checkpoint, so the same step can appear once per attempt."""
    attempts = _attempts(summary)
    curves = []
    for index, a in enumerate(attempts):
        following = attempts[index + 1]["started_at"] if index + 1 < len(attempts) else float("inf")
        points = sorted((step, value) for step, value, t in history if a["started_at"] <= t < following)
        curves.append(
            AttemptCurve(
                attempt=a["attempt"],
                outcome=a["outcome"],
                steps=tuple(step for step, _ in points),
                values=tuple(value for _, value in points),
                failed_at_step=None if a["outcome"] == "SUCCEEDED" else a.get("last_step"),
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
