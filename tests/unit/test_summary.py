"""trainflow.summary: per-attempt rows and goodput of a run."""

from __future__ import annotations

from trainflow.failures import AttemptResult, Outcome
from trainflow.summary import attempt_rows, goodput, run_status


def attempt(n, outcome, *, started, ended, detected, failed=None, first_step=None, resumed=0, last=0, step_time=0.0):
    return AttemptResult(
        attempt=n,
        outcome=outcome,
        reason="r",
        world_size=2,
        started_at=started,
        ended_at=ended,
        detected_at=detected,
        failed_at=failed,
        last_step=last,
        resumed_from_step=resumed,
        first_step_at=first_step,
        step_time_total_s=step_time,
    )


def crash_then_success() -> list[AttemptResult]:
    return [
        attempt(1, Outcome.CRASHED, started=100.0, ended=112.0, detected=111.0, failed=110.0,
                first_step=101.0, resumed=0, last=45, step_time=9.0),
        attempt(2, Outcome.SUCCEEDED, started=113.0, ended=130.0, detected=130.0,
                first_step=115.5, resumed=40, last=100, step_time=12.0),
    ]


def test_recovery_time_and_lost_steps():
    first, second = attempt_rows(crash_then_success())
    assert first["recovery_s"] is None  # nothing to recover from
    assert first["lost_steps"] == 5  # steps 41..45 are redone
    assert first["detection_latency_s"] == 1.0
    assert second["recovery_s"] == 4.5  # first step at 115.5, failure detected at 111.0
    assert second["lost_steps"] == 0
    assert second["detection_latency_s"] is None
    assert [r["outcome"] for r in (first, second)] == ["CRASHED", "SUCCEEDED"]


def test_no_recovery_when_next_attempt_never_stepped():
    results = crash_then_success()
    results[1].first_step_at = None
    assert attempt_rows(results)[1]["recovery_s"] is None


def test_lost_steps_never_negative():
    results = crash_then_success()
    results[1].resumed_from_step = 50  # resumed past the last reported step
    assert attempt_rows(results)[0]["lost_steps"] == 0


def test_goodput_in_unit_interval():
    value = goodput(crash_then_success())
    assert 0.0 < value <= 1.0
    # 100 useful steps at 21 s / 105 executed steps = 20 s, over 30 s of wall time
    assert value == round(20 / 30, 4)


def test_goodput_capped_at_one():
    results = [attempt(1, Outcome.SUCCEEDED, started=0.0, ended=1.0, detected=1.0, last=10, step_time=50.0)]
    assert goodput(results) == 1.0


def test_goodput_zero_without_executed_steps():
    results = [attempt(1, Outcome.CRASHED, started=0.0, ended=5.0, detected=5.0, resumed=20, last=20)]
    assert goodput(results) == 0.0


def test_goodput_none_without_attempts():
    assert goodput([]) is None


def test_run_status():
    assert run_status(crash_then_success()) == "succeeded"
    assert run_status(crash_then_success()[:1]) == "failed"
    assert run_status([]) == "failed"
