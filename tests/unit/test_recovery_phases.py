"""trainflow.contracts.recovery: a recovery split into its phases from the attempts' timestamps."""

from __future__ import annotations

import time

from trainflow.contracts import AttemptResult, Outcome, WorkerMilestones, run_ledger
from trainflow.drills.drill import phases_line
from trainflow.runtime.process_clock import process_started_at


def attempt(n, outcome, *, started, detected, first_step=None, stopped=None, milestones=None):
    return AttemptResult(
        attempt=n,
        outcome=outcome,
        reason="r",
        world_size=2,
        started_at=started,
        ended_at=detected,
        detected_at=detected,
        failed_at=detected - 0.1,
        last_step=10 * n,
        resumed_from_step=0,
        first_step_at=first_step,
        stopped_at=stopped,
        milestones=milestones or WorkerMilestones(),
    )


def crash_then_restore(milestones: WorkerMilestones) -> list[AttemptResult]:
    """Attempt 1 crashes, detected at 100.0; its processes are gone at 100.4; attempt 2 is launched
    at 101.0 and reaches its first step at 105.0."""
    return [
        attempt(1, Outcome.CRASHED, started=90.0, detected=100.0, first_step=91.0, stopped=100.4),
        attempt(2, Outcome.SUCCEEDED, started=101.0, detected=120.0, first_step=105.0, milestones=milestones),
    ]


def slowest_ranks() -> WorkerMilestones:
    marks = WorkerMilestones()
    for rank_times in ((101.2, 102.8, 103.1, 104.0), (101.3, 103.0, 103.2, 104.1)):  # rank 0, then rank 1
        for name, at in zip(("process_started_at", "imported_at", "rendezvous_at", "restored_at"), rank_times):
            marks.reached(name, at)
    return marks


def test_the_phases_split_the_recovery_at_the_slowest_ranks_points():
    second = run_ledger(crash_then_restore(slowest_ranks()), world_size=2).attempts[1]
    phases = second.recovery_phases
    assert second.recovery_s == 5.0
    assert phases.model_dump() == {
        "stop": 0.4,
        "between_attempts": 0.6,
        "launch": 0.3,
        "imports": 1.7,
        "rendezvous": 0.2,
        "restore": 0.9,
        "first_step": 0.9,
    }
    assert round(sum(phases.model_dump().values()), 3) == second.recovery_s
    assert phases.as_metrics()["recovery_imports_s"] == 1.7


def test_a_missing_point_gives_its_time_to_the_next_phase():
    marks = slowest_ranks()
    marks.restored_at = None  # a fresh start: nothing to restore
    results = crash_then_restore(marks)
    results[0].stopped_at = None  # released without a record of the stop
    phases = run_ledger(results, world_size=2).attempts[1].recovery_phases
    assert phases.stop is None and phases.between_attempts == 1.0  # detection -> launch
    assert phases.restore is None and phases.first_step == 1.8  # rendezvous -> first step
    assert round(sum(v for v in phases.model_dump().values() if v is not None), 3) == 5.0


def test_other_clocks_never_make_a_phase_negative():
    marks = slowest_ranks()
    marks.process_started_at = 100.9  # a worker's clock a little behind the orchestrator's launch time
    phases = run_ledger(crash_then_restore(marks), world_size=2).attempts[1].recovery_phases
    assert phases.launch == 0.0 and phases.imports == 2.0  # from the launch, not from before it


def test_no_split_without_a_first_step_and_for_the_first_attempt():
    first, second = run_ledger(
        [crash_then_restore(slowest_ranks())[0], attempt(2, Outcome.CRASHED, started=101.0, detected=110.0)],
        world_size=2,
    ).attempts
    assert first.recovery_phases is None and second.recovery_phases is None
    assert phases_line(None) == "no phase split recorded"


def test_the_summary_and_the_drill_line_carry_the_same_split():
    second = run_ledger(crash_then_restore(slowest_ranks()), world_size=2).attempts[1]
    row = second.model_dump(mode="json")
    assert row["recovery_phases"]["imports"] == 1.7
    assert phases_line(row["recovery_phases"]) == (
        "stop 0.40, between attempts 0.60, launch 0.30, imports 1.70, rendezvous 0.20, restore 0.90, first step 0.90 s"
    )


def test_this_process_knows_when_it_started():
    started = process_started_at()
    assert started is not None and started <= time.time()
