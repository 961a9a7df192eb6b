"""The soak's plan and report: faults of every kind at seeded random steps, each in its own slice of
the job; a confusion matrix and every fault, lost step or attempt that is not as it should be."""

from __future__ import annotations

import pytest

from trainflow.soak import plan_faults, render_confusion, soak_report, soak_spec
from trainflow.spec import RunSpec, SpecError


def spec(steps: int = 600, every: int = 20) -> RunSpec:
    return RunSpec.model_validate({"name": "soak", "workload": {"entrypoint": "examples/digits/train.py",
                                                                 "steps": steps}, "checkpoint": {"every_steps": every}})


def test_faults_cycle_through_every_kind_each_past_the_previous_ones_resume_point():
    plans = plan_faults(spec(), 8, seed=3)
    assert {p.kind.value for p in plans} == {"crash", "kill", "hang", "preempt"}
    assert [p.attempt for p in plans] == list(range(1, 9))
    steps = [p.at_step for p in plans]
    assert steps == sorted(steps) and all(b - a > 20 for a, b in zip(steps, steps[1:]))
    assert plan_faults(spec(), 8, seed=3) == plans  # the seed decides
    assert plan_faults(spec(), 8, seed=4) != plans


def test_too_few_steps_for_the_faults_is_refused_naming_the_field():
    with pytest.raises(SpecError, match="workload.steps"):
        plan_faults(spec(steps=100), 8, seed=0)


def test_the_soak_spec_has_a_budget_for_every_fault():
    assert soak_spec(spec(), 12).fault_tolerance.max_restarts == 12


def row(attempt: int, outcome: str, lost: int, last_step: int = 100) -> dict:
    return {"attempt": attempt, "outcome": outcome, "lost_steps": lost, "last_step": last_step, "reason": "r"}


def test_the_report_counts_detections_and_names_what_went_wrong():
    plans = plan_faults(spec(), 2, seed=0)
    injected = [{"injected": True, "detail": {"step": p.at_step}} for p in plans]
    expected = {"crash": "CRASHED", "kill": "KILLED", "hang": "HUNG", "preempt": "PREEMPTED"}
    good = {"status": "succeeded", "params_sha256": "x", "total_steps": 600, "faults": injected,
            "attempts": [row(1, expected[plans[0].kind.value], 5), row(2, expected[plans[1].kind.value], 0),
                         row(3, "SUCCEEDED", 0, 600)]}
    report = soak_report(plans, good, {"params_sha256": "x"}, [], every_steps=20)
    assert report["passed"] is True, report
    assert sum(c["count"] for c in report["confusion"]) == 2
    assert plans[0].kind.value in render_confusion(report)

    bad = {**good, "attempts": [row(1, "INFRA", 5), row(2, expected[plans[1].kind.value], 30),
                                row(3, "CRASHED", 0, 600), row(4, "SUCCEEDED", 0, 600)]}
    report = soak_report(plans, bad, {"params_sha256": "y"}, ["pid 7 (python)"], every_steps=20)
    assert report["passed"] is False
    assert [f["detected"] for f in report["misclassified"]] == ["INFRA"]
    assert [a["attempt"] for a in report["unexplained_attempts"]] == [3]
    assert [a["attempt"] for a in report["successes_recorded_as_failures"]] == [3]
    assert report["params_match_baseline"] is False and report["leftovers"] == ["pid 7 (python)"]
