"""The soak's plan and report: faults of every kind at seeded random steps, each in its own slice of
the job; a confusion matrix and every fault, lost step or attempt that is not as it should be."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainflow.drills.chaos import FaultKind
from trainflow.drills.cpu_load import cpu_load
from trainflow.drills.soak import plan_faults, render_confusion, soak_kinds, soak_report, soak_spec
from trainflow.runspec import RunSpec, SpecError


def spec(steps: int = 600, every: int = 20, uri: str = "checkpoints/soak", in_place: bool = False) -> RunSpec:
    return RunSpec.model_validate(
        {
            "name": "soak",
            "workload": {"entrypoint": "examples/digits/train.py", "steps": steps},
            "checkpoint": {"every_steps": every, "uri": uri},
            "fault_tolerance": {"in_process_restart": in_place},
        }
    )


def test_faults_cycle_through_every_kind_each_past_the_previous_ones_resume_point():
    plans = plan_faults(spec(), 8, seed=3)
    assert {p.kind.value for p in plans} == {"crash", "kill", "hang", "preempt", "corrupt-checkpoint"}
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


def row(attempt: int, outcome: str, lost: int, last_step: int = 100, resumed: int = 0) -> dict:
    return {
        "attempt": attempt,
        "outcome": outcome,
        "lost_steps": lost,
        "last_step": last_step,
        "reason": "r",
        "resumed_from_step": resumed,
    }


def test_the_report_counts_detections_and_names_what_went_wrong():
    plans = plan_faults(spec(), 2, seed=0)
    injected = [{"injected": True, "detail": {"step": p.at_step}} for p in plans]
    expected = {"crash": "CRASHED", "kill": "KILLED", "hang": "HUNG", "preempt": "PREEMPTED"}
    good = {
        "status": "succeeded",
        "params_sha256": "x",
        "total_steps": 600,
        "faults": injected,
        "attempts": [
            row(1, expected[plans[0].kind.value], 5),
            row(2, expected[plans[1].kind.value], 0),
            row(3, "SUCCEEDED", 0, 600),
        ],
    }
    report = soak_report(plans, good, {"params_sha256": "x"}, [], every_steps=20)
    assert report["passed"] is True, report
    assert sum(c["count"] for c in report["confusion"]) == 2
    assert plans[0].kind.value in render_confusion(report)

    bad = {
        **good,
        "attempts": [
            row(1, "INFRA", 5),
            row(2, expected[plans[1].kind.value], 30),
            row(3, "CRASHED", 0, 600),
            row(4, "SUCCEEDED", 0, 600),
        ],
    }
    report = soak_report(plans, bad, {"params_sha256": "y"}, ["pid 7 (python)"], every_steps=20)
    assert report["passed"] is False
    assert [f["detected"] for f in report["misclassified"]] == ["INFRA"]
    assert [a["attempt"] for a in report["unexplained_attempts"]] == [3]
    assert [a["attempt"] for a in report["successes_recorded_as_failures"]] == [3]
    assert report["params_match_baseline"] is False and report["leftovers"] == ["pid 7 (python)"]


def test_with_in_process_restart_a_fault_recovered_in_place_leaves_the_next_in_its_attempt():
    kinds = [FaultKind.crash, FaultKind.preempt, FaultKind.exception, FaultKind.hang, FaultKind.kill]
    plans = plan_faults(spec(in_place=True), 10, seed=2, kinds=kinds)
    attempt = 1
    for plan in plans:  # only a preemption ends its attempt
        assert plan.attempt == attempt, plans
        attempt += plan.kind == FaultKind.preempt
    assert [p.attempt for p in plan_faults(spec(), 10, seed=2, kinds=kinds[:2] + kinds[3:])] == list(range(1, 11))


def test_the_report_reads_a_fault_recovered_in_place_from_its_attempts_round():
    plans = plan_faults(spec(in_place=True), 3, seed=0, kinds=[FaultKind.crash, FaultKind.kill, FaultKind.preempt])
    by_kind = {p.kind: p for p in plans}
    injected = [{"injected": True, "detail": {"step": p.at_step}} for p in plans]
    rounds = [
        {"outcome": {"crash": "CRASHED", "kill": "KILLED"}[p.kind.value], "lost_steps": 9, "restored_step": p.at_step}
        for p in plans
        if p.kind != FaultKind.preempt
    ]
    preempted = by_kind[FaultKind.preempt].attempt
    attempts = []
    for number in range(1, 3):
        ends = "PREEMPTED" if number == preempted else "SUCCEEDED"
        mine = [r for p, r in zip([p for p in plans if p.kind != FaultKind.preempt], rounds) if p.attempt == number]
        # an attempt's lost steps count its rounds' (9 each) beside the preemption's own (0)
        lost = 9 * len(mine)
        attempts.append({**row(number, ends, lost, 600 if ends == "SUCCEEDED" else 100), "in_place": mine})
    summary = {"status": "succeeded", "params_sha256": "x", "total_steps": 600, "faults": injected}
    report = soak_report(plans, {**summary, "attempts": attempts}, {"params_sha256": "x"}, [], every_steps=20)
    assert report["passed"] is True, report
    assert sorted((f["kind"], f["in_place"], f["lost_steps"]) for f in report["per_fault"]) == [
        ("crash", True, 9),
        ("kill", True, 9),
        ("preempt", False, 0),
    ]
    # a round no fault explains is unexplained, as a failed attempt is
    spare = {"outcome": "CRASHED", "lost_steps": 0, "restored_step": 5, "round": 9}
    attempts[-1] = {**attempts[-1], "in_place": [*attempts[-1]["in_place"], spare]}
    report = soak_report(plans, {**summary, "attempts": attempts}, {"params_sha256": "x"}, [], every_steps=20)
    assert report["passed"] is False and [a.get("round") for a in report["unexplained_attempts"]] == [9]


def test_kinds_that_cannot_run_here_are_left_out_with_a_reason_or_refused_when_asked_for(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    kinds, not_soaked = soak_kinds(spec())
    assert FaultKind.storage_outage not in kinds and "s3://" in not_soaked["storage-outage"]
    assert "straggler" in not_soaked and FaultKind.corrupt_checkpoint in kinds
    with pytest.raises(SpecError, match="--kinds storage-outage"):
        soak_kinds(spec(), [FaultKind.crash, FaultKind.storage_outage])
    with pytest.raises(SpecError, match="--kinds straggler"):
        soak_kinds(spec(), [FaultKind.straggler])
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    kinds, not_soaked = soak_kinds(spec(uri="s3://bucket/soak"))
    assert FaultKind.storage_outage in kinds and FaultKind.node_loss not in kinds and "node-loss" in not_soaked
    with pytest.raises(SpecError, match="--kinds node-loss"):
        soak_kinds(spec(uri="s3://bucket/soak"), [FaultKind.node_loss, FaultKind.storage_outage])


def test_the_spec_and_plan_give_each_kind_what_it_needs_to_end_its_attempt():
    kinds = [FaultKind.node_loss, FaultKind.storage_outage, FaultKind.crash]
    soaked = soak_spec(spec(uri="s3://bucket/soak"), 9, kinds)
    assert soaked.backend_config.network.value == "namespaces"  # a node lost is a cut network link
    assert soaked.checkpoint.snapshot_every_s == 0  # every save goes to the store the outage cuts
    assert soaked.fault_tolerance.max_infra_failures >= 9 and soaked.fault_tolerance.backoff_s == 0
    plans = plan_faults(soaked, 9, seed=1, kinds=kinds)
    outages = [p for p in plans if p.kind == FaultKind.storage_outage]
    hang_limit = soaked.fault_tolerance.hang_timeout_s or 30.0
    assert len(outages) == 3 and all(p.stall and p.duration_s > hang_limit for p in outages)
    assert all(not p.permanent and p.node < soaked.resources.nodes for p in plans if p.kind == FaultKind.node_loss)


def test_a_damaged_checkpoint_loaded_at_the_restore_fails_the_soak():
    plans = plan_faults(spec(), 1, seed=0, kinds=[FaultKind.corrupt_checkpoint])
    damaged = {"injected": True, "detail": {"step": plans[0].at_step, "damaged": "run/step-00000300/model.pt"}}
    summary = {
        "status": "succeeded",
        "params_sha256": "x",
        "total_steps": 600,
        "faults": [damaged],
        "attempts": [row(1, "KILLED", 30), row(2, "SUCCEEDED", 0, 600, resumed=280)],
    }
    report = soak_report(plans, summary, {"params_sha256": "x"}, [], every_steps=20)
    assert report["per_fault"][0]["rejected_at_restore"] is True and report["passed"] is True
    summary["attempts"][1]["resumed_from_step"] = 300
    report = soak_report(plans, summary, {"params_sha256": "x"}, [], every_steps=20)
    assert [f["damaged_step"] for f in report["damaged_checkpoints_loaded"]] == [300]
    assert report["passed"] is False


def test_the_cpu_load_is_one_busy_loop_per_process_asked_and_is_gone_when_the_block_fails():
    with pytest.raises(RuntimeError):
        with cpu_load(2, niceness=5) as load:
            pids = load.pids
            assert len(pids) == 2
            assert all(Path(f"/proc/{pid}/stat").read_text().split()[18] == "5" for pid in pids)  # nice value
            raise RuntimeError("the soak failed")
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert load.load_before is not None and load.load_after is not None


def test_a_backend_that_cannot_inject_a_kind_leaves_it_out_and_refuses_it_by_its_missing_ability():
    on_pods = RunSpec.model_validate(
        {
            "name": "soak",
            "workload": {"entrypoint": "examples/digits/train.py", "steps": 600},
            "resources": {"backend": "kubernetes"},
            "kubernetes": {"image": "registry.example/trainflow:1"},
            "checkpoint": {"every_steps": 20, "uri": "s3://bucket/soak"},
        }
    )
    kinds, not_soaked = soak_kinds(on_pods)
    assert FaultKind.crash not in kinds and "SignalsRanks" in not_soaked["crash"]
    assert "PreemptsNodes" in not_soaked["preempt"]
    with pytest.raises(SpecError, match="--kinds preempt: the kubernetes backend cannot preempt a node"):
        soak_kinds(on_pods, [FaultKind.preempt])
