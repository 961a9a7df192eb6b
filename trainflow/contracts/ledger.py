"""The run ledger: every figure of a run, computed once, here, from its attempts.

The summary (`--json`), the MLflow metrics, the pictures, the Prefect artifact, the diagnosis and
the notebook all read these figures and print them with `percent`, `seconds` and `milliseconds`
below, so they agree to the printed digit.

Step figures are rank 0's: every step it ran reports its step time (compute and communication,
data wait included; checkpoint stalls are measured apart, after the step), and the watcher sums
them per attempt (`AttemptResult.totals`). The mean step time is their sum over their count.
Wall time runs from the first attempt's start to the last attempt's end. Of it:

- productive training: the steps that count toward the final model, at the mean step time;
- lost work: steps run but redone after a failure (past the checkpoint resumed from), likewise;
- failure detection: from a failure to the orchestrator noticing it;
- recovery: from that detection to the first step of the next attempt;
- checkpoint stalls: the time training waited for checkpoints;
- other: the rest (start-up, shutdown, backoff, releasing nodes).

Goodput is productive training over wall time.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trainflow.contracts.attempt import AttemptResult
from trainflow.contracts.outcome import Outcome
from trainflow.contracts.recovery import RecoveryPhases, recovery_phases


class AttemptFigures(BaseModel):
    """One row of the summary's `attempts`."""

    attempt: int
    outcome: Outcome
    reason: str
    world_size: int
    resumed_from_step: int
    last_step: int
    started_at: float
    ended_at: float
    detected_at: float | None  # None for a success
    detection_latency_s: float | None
    recovery_s: float | None  # from the previous attempt's detection to this one's first step
    recovery_phases: RecoveryPhases | None = None  # where that time went (contracts/recovery.py)
    lost_steps: int  # steps of this attempt redone: by the next attempt, or in it after a recovery in place
    steps_run: int  # steps rank 0 ran (and reported) in this attempt
    step_time_s: float  # their summed step time
    resumed_from: str | None = None  # a plain script: the copy of its own checkpoint it restored
    # its recoveries in place (contracts/in_place.py), each from the failure to every rank's state back
    in_place: list[dict[str, Any]] = []


class RunFigures(BaseModel):
    """The run's figures (the summary's `costs`, each also an MLflow metric of the run)."""

    wall_s: float
    steps_run: int
    useful_steps: int
    lost_steps: int
    step_time_total_s: float
    mean_step_time_s: float  # 0.0 when no step reported a time (a plain torchrun script)
    productive_s: float
    lost_work_s: float
    detection_s_total: float
    recovery_s_total: float
    checkpoint_stall_total_s: float
    other_s: float
    goodput: float
    comm_share: float  # of step time
    data_share: float
    checkpoint_share: float  # checkpoint stalls over step time
    device_hours: float
    wasted_device_hours: float  # lost work, detection, recovery and stalls, on every device


class RunLedger(BaseModel):
    attempts: list[AttemptFigures]
    figures: RunFigures

    def segments(self) -> list[tuple[str, float, float]]:
        """Where the wall time went, in the order the pictures draw it: (label, seconds, share of
        the wall time). The productive share is the goodput itself, not a second rounding of it."""
        f = self.figures
        parts = [
            (LOST, f.lost_work_s),
            (DETECTION, f.detection_s_total),
            (RECOVERY, f.recovery_s_total),
            (STALLS, f.checkpoint_stall_total_s),
            (OTHER, f.other_s),
        ]
        wall = f.wall_s
        return [(PRODUCTIVE, f.productive_s, f.goodput)] + [
            (label, value, value / wall if wall > 0 else 0.0) for label, value in parts
        ]


PRODUCTIVE = "productive training"
LOST = "lost work (steps redone)"
DETECTION = "failure detection"
RECOVERY = "recovery (detection to next step)"
STALLS = "checkpoint stalls"
OTHER = "startup, shutdown and other"


def _total(results: list[AttemptResult], key: str) -> float:
    return sum(float(r.totals.get(key, 0.0)) for r in results)


def attempt_figures(results: list[AttemptResult]) -> list[AttemptFigures]:
    rows = []
    for index, result in enumerate(results):
        following = results[index + 1] if index + 1 < len(results) else None
        previous = results[index - 1] if index > 0 else None
        recovery = phases = None
        if previous is not None and result.first_step_at is not None:
            recovery = round(max(0.0, result.first_step_at - previous.detected_at), 3)
            phases = recovery_phases(previous, result)
        latency = result.detection_latency_s
        rows.append(
            AttemptFigures(
                attempt=result.attempt,
                outcome=result.outcome,
                reason=result.reason,
                world_size=result.world_size,
                resumed_from_step=result.resumed_from_step,
                last_step=result.last_step,
                started_at=result.started_at,
                ended_at=result.ended_at,
                detected_at=None if result.outcome == Outcome.SUCCEEDED else result.detected_at,
                detection_latency_s=None if latency is None else round(latency, 3),
                recovery_s=recovery,
                recovery_phases=phases,
                lost_steps=(max(0, result.last_step - following.resumed_from_step) if following else 0)
                + sum(restart.lost_steps for restart in result.in_place),
                steps_run=int(result.totals.get("steps", 0)),
                step_time_s=round(float(result.totals.get("step_time_s", 0.0)), 6),
                resumed_from=result.resumed_from,
                in_place=[
                    restart.as_dict() | {"recovery_s": round(restart.recovery_s, 3)} for restart in result.in_place
                ],
            )
        )
    return rows


def run_ledger(results: list[AttemptResult], world_size: int) -> RunLedger:
    """Every figure of a run from its attempts (at least one)."""
    if not results:
        raise ValueError("a run ledger needs at least one attempt")
    attempts = attempt_figures(results)
    wall = max(0.0, results[-1].ended_at - results[0].started_at)
    steps = int(_total(results, "steps"))
    step_time = _total(results, "step_time_s")
    mean_step = step_time / steps if steps else 0.0
    useful = max(0, results[-1].last_step - results[0].resumed_from_step)
    lost = sum(a.lost_steps for a in attempts)
    productive = useful * mean_step
    lost_work = lost * mean_step
    detection = sum(a.detection_latency_s or 0.0 for a in attempts if a.outcome != Outcome.SUCCEEDED)
    recovery = sum(a.recovery_s or 0.0 for a in attempts) + sum(r["recovery_s"] for a in attempts for r in a.in_place)
    stall = _total(results, "checkpoint_stall_s")
    accounted = productive + lost_work + detection + recovery + stall
    wasted = lost_work + detection + recovery + stall

    def share(part: float) -> float:
        return round(part / step_time, 4) if step_time else 0.0

    figures = RunFigures(
        wall_s=round(wall, 3),
        steps_run=steps,
        useful_steps=useful,
        lost_steps=lost,
        step_time_total_s=round(step_time, 6),
        mean_step_time_s=round(mean_step, 6),
        productive_s=round(productive, 3),
        lost_work_s=round(lost_work, 3),
        detection_s_total=round(detection, 3),
        recovery_s_total=round(recovery, 3),
        checkpoint_stall_total_s=round(stall, 3),
        other_s=round(max(0.0, wall - accounted), 3),
        goodput=round(min(1.0, productive / wall), 4) if wall > 0 else 0.0,
        comm_share=share(_total(results, "comm_wait_s")),
        data_share=share(_total(results, "data_wait_s")),
        checkpoint_share=share(stall),
        device_hours=round(world_size * wall / 3600, 6),
        wasted_device_hours=round(world_size * wasted / 3600, 6),
    )
    return RunLedger(attempts=attempts, figures=figures)


# ---- how every figure is printed, wherever it is printed --------------------------------------


def percent(fraction: float | None) -> str:
    return "–" if fraction is None else f"{fraction:.1%}"


def seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def milliseconds(value_s: float) -> str:
    return f"{value_s * 1e3:.1f} ms"
