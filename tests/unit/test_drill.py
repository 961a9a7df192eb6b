"""The drill's verdict: it passes only when the attempts are exactly the injected fault, detected as
its own kind, then success, with few lost steps, the newest checkpoint resumed and an exact result."""

from __future__ import annotations

import pytest

from trainflow.drills.chaos import FaultKind, FaultPlan
from trainflow.drills.drill import baseline_failed_report, check_plan, drill_report
from trainflow.runspec import RunSpec, SpecError

BASELINE = {"params_sha256": "aa" * 32, "mlflow_run_id": "base"}


def attempt(n: int, outcome: str, last_step: int, resumed_from: int, lost: int = 0) -> dict:
    return {
        "attempt": n,
        "outcome": outcome,
        "last_step": last_step,
        "resumed_from_step": resumed_from,
        "ended_at": 10.0 * n,
        "detected_at": 10.0 * n - 1,
        "recovery_s": 1.0,
        "lost_steps": lost,
    }


def summary(
    attempts: list[dict], injected_step: int = 70, params: str = "aa" * 32, checkpoints=(), status: str = "succeeded"
) -> dict:
    return {
        "status": status,
        "attempts": attempts,
        "params_sha256": params,
        "final_step": 200,
        "checkpoints": list(checkpoints),
        "reason": "why",
        "faults": [{"injected": True, "injected_at": 5.0, "target": "rank 1", "detail": {"step": injected_step}}],
    }


def verdict(kind: str, run: dict, every_steps: int = 50, **plan) -> dict:
    return drill_report(FaultPlan(kind=kind, at_step=70, **plan), run, BASELINE, None, True, every_steps)


def test_one_fault_detected_as_itself_then_success_passes():
    report = verdict("crash", summary([attempt(1, "CRASHED", 70, 0, lost=20), attempt(2, "SUCCEEDED", 200, 50)]))
    assert report["broken_rules"] == [] and report["passed"] is True


def test_an_extra_failed_attempt_fails_the_drill():
    run = summary(
        [attempt(1, "CRASHED", 70, 0, 20), attempt(2, "CRASHED", 200, 50, 0), attempt(3, "SUCCEEDED", 200, 200)]
    )
    report = verdict("crash", run)
    assert report["passed"] is False
    assert any("attempts were ['CRASHED', 'CRASHED', 'SUCCEEDED']" in rule for rule in report["broken_rules"])


def test_the_wrong_detected_kind_fails_the_drill():
    report = verdict("crash", summary([attempt(1, "INFRA", 72, 0, 22), attempt(2, "SUCCEEDED", 200, 50)]))
    assert not report["passed"]
    assert "detected as INFRA, expected CRASHED" in report["broken_rules"]


def test_more_lost_steps_than_the_checkpoint_interval_fail_the_drill():
    committed = [
        {"step": 50, "uri": "s3://b/p/step-00000050", "verified": True, "committed_at": 4.0},
        {"step": 60, "uri": "s3://b/p/step-00000060", "verified": True, "committed_at": 6.0},
    ]  # after
    report = verdict(
        "crash", summary([attempt(1, "CRASHED", 72, 0, 72), attempt(2, "SUCCEEDED", 200, 0)], checkpoints=committed)
    )
    assert "lost 72 steps, more than 70" in report["broken_rules"]  # 50, plus 20 steps of a save in flight
    assert any(
        "older than the newest checkpoint committed before the fault (step 50)" in rule
        for rule in report["broken_rules"]
    )


def test_a_preemption_must_lose_nothing():
    report = verdict("preempt", summary([attempt(1, "PREEMPTED", 71, 0, 1), attempt(2, "SUCCEEDED", 200, 70)]))
    assert "lost 1 steps, more than 0" in report["broken_rules"]


def test_a_fault_injected_late_fails_the_drill():
    report = verdict(
        "crash", summary([attempt(1, "CRASHED", 90, 0, 40), attempt(2, "SUCCEEDED", 200, 50)], injected_step=90)
    )
    assert "injected at step 90, not at 70 (+-1)" in report["broken_rules"]


def test_an_inexact_resume_fails_where_the_world_size_is_kept():
    run = summary([attempt(1, "KILLED", 70, 0, 20), attempt(2, "SUCCEEDED", 200, 50)], params="bb" * 32)
    assert "final parameters differ from the baseline's (params_sha256)" in verdict("kill", run)["broken_rules"]
    lost = summary([attempt(1, "NODE_LOST", 70, 0, 70), attempt(2, "SUCCEEDED", 200, 0)], params="bb" * 32)
    assert verdict("node-loss", lost, permanent=True)["passed"] is True  # a smaller world trains differently


def test_a_straggler_is_detected_without_a_failed_attempt():
    run = summary([attempt(1, "SUCCEEDED", 200, 0)])
    assert "detected as None, expected STRAGGLER" in verdict("straggler", run)["broken_rules"]
    run["stragglers"] = [{"step": 90, "t": 7.0}]
    assert verdict("straggler", run)["passed"] is True


def test_a_failed_baseline_still_gives_a_report_that_fails():
    report = baseline_failed_report(
        FaultPlan(kind=FaultKind.crash, at_step=30),
        {"status": "failed", "reason": "rank 0 raised ValueError", "teardown": {"clean": True}},
    )
    assert report["passed"] is False and "baseline failed" in report["broken_rules"][0]


def gated_fault(summary_: dict, at_gate: bool) -> dict:
    """The drill's record of a fault at step 30 with every rank seen at step 30, at the gate or not."""
    summary_["faults"][0]["detail"] = {"step": 30, "steps": {"0": 30, "1": 30}, "at_gate": at_gate}
    return summary_


def test_at_the_gate_the_save_before_the_faults_own_is_committed_and_must_be_resumed():
    # every rank stood at the gate after its step-30 checkpoint call, so the step-20 save was finished
    older = gated_fault(summary([attempt(1, "CRASHED", 30, 0, 20), attempt(2, "SUCCEEDED", 60, 10)]), at_gate=True)
    report = drill_report(FaultPlan(kind="crash", at_step=30), older, BASELINE, None, True, 10)
    assert report["newest_checkpoint_before_fault"] == 20
    assert (
        "resumed from step 10, older than the newest checkpoint committed before the fault (step 20)"
        in report["broken_rules"]
    )
    assert "lost 20 steps, more than 10" in report["broken_rules"]
    newest = gated_fault(summary([attempt(1, "CRASHED", 30, 0, 10), attempt(2, "SUCCEEDED", 60, 20)]), at_gate=True)
    assert drill_report(FaultPlan(kind="crash", at_step=30), newest, BASELINE, None, True, 10)["passed"] is True


def test_a_rank_seen_at_a_checkpoint_step_may_still_be_finishing_the_save_before_it():
    # without the gate a rank reports step 30 before its step-30 save waits for the step-20 one: only
    # the step-10 save is known to be finished, and a resume from it is what the run could do
    run = gated_fault(summary([attempt(1, "CRASHED", 30, 0, 20), attempt(2, "SUCCEEDED", 60, 10)]), at_gate=False)
    report = drill_report(FaultPlan(kind="crash", at_step=30), run, BASELINE, None, True, 10)
    assert report["newest_checkpoint_before_fault"] == 10
    assert report["broken_rules"] == [] and report["passed"] is True


def on_backend(backend: str) -> RunSpec:
    fields = {
        "name": "refusal",
        "workload": {"entrypoint": "examples/digits/train.py", "steps": 100},
        "resources": {"backend": backend, "nodes": 2},
        "checkpoint": {"uri": "s3://bucket/refusal"},
    }
    if backend == "kubernetes":
        fields["kubernetes"] = {"image": "registry.example/trainflow:1"}
    return RunSpec.model_validate(fields)


@pytest.mark.parametrize(
    ("kind", "inability"),
    [
        (FaultKind.crash, "the kubernetes backend cannot signal a rank's process (it does not implement SignalsRanks)"),
        (FaultKind.preempt, "the kubernetes backend cannot preempt a node (it does not implement PreemptsNodes)"),
        (
            FaultKind.node_loss,
            "the kubernetes backend cannot cut a node off the network (it does not implement CutsNodes)",
        ),
    ],
)
def test_a_fault_the_backend_cannot_inject_is_refused_naming_its_missing_ability(kind, inability):
    with pytest.raises(SpecError) as refused:
        check_plan(on_backend("kubernetes"), FaultPlan(kind=kind, at_step=30))
    assert str(refused.value) == f"--fault {kind.value}: {inability}"
    for backend in ("local", "slurm"):
        check_plan(on_backend(backend), FaultPlan(kind=kind, at_step=30))  # both offer every ability


# --- plain scripts: faults at a time, judged by what plain mode can prove -------------------------------


def plain_spec(**plain) -> RunSpec:
    spec = on_backend("local")
    workload = spec.workload.model_copy(update={"mode": "plain", "plain": spec.workload.plain.model_copy(update=plain)})
    return spec.model_copy(update={"workload": workload})


@pytest.mark.parametrize(
    ("plan", "refusal"),
    [
        (FaultPlan(kind="crash", at_step=30), "--at-s: a plain script reports no steps"),
        (FaultPlan(kind="hang", at_s=5), "--fault hang: a plain script reports no progress"),
        (FaultPlan(kind="straggler", at_s=5), "--fault straggler: a plain script reports no step times"),
        (FaultPlan(kind="storage-outage", at_s=5), "--fault storage-outage: a plain script's ranks never use"),
        (
            FaultPlan(kind="corrupt-checkpoint", at_s=5),
            "--fault corrupt-checkpoint: a plain script's checkpoints are "
            "copied only with workload.plain.checkpoint_dir",
        ),
    ],
)
def test_a_fault_that_cannot_go_into_a_plain_script_is_refused(plan, refusal):
    with pytest.raises(SpecError, match="^" + refusal.replace(".", r"\.")):
        check_plan(plain_spec(), plan)


def test_plain_faults_at_a_time_are_accepted_and_a_time_is_refused_for_a_runtime_script():
    for kind in ("crash", "kill", "preempt", "node-loss"):
        check_plan(plain_spec(), FaultPlan(kind=kind, at_s=5))
    check_plan(plain_spec(checkpoint_dir="out"), FaultPlan(kind="corrupt-checkpoint", at_s=5))
    with pytest.raises(SpecError, match="^--at-s: only for plain scripts"):
        check_plan(on_backend("local"), FaultPlan(kind="crash", at_s=5))


def plain_run(resumed_from: str | None, damaged: str = "") -> dict:
    copies = [
        {"step": n, "uri": f"s3://b/p/run/step-0000000{n}", "verified": True, "committed_at": float(n)}
        for n in (1, 2, 3)
    ]  # copy 3 is committed after the fault (at 2.5)
    first = {**attempt(1, "KILLED", 0, 0), "resumed_from": None}
    second = {**attempt(2, "SUCCEEDED", 0, 0), "resumed_from": resumed_from}
    return {
        "status": "succeeded",
        "attempts": [first, second],
        "params_sha256": None,
        "checkpoints": copies,
        "reason": "every rank exited 0",
        "faults": [
            {"injected": True, "injected_at": 2.5, "target": "rank 1", "detail": {"at_s": 4.0, "damaged": damaged}}
        ],
    }


def test_a_plain_drill_passes_resuming_from_the_newest_copy_before_the_fault_and_not_from_a_damaged_one():
    report = drill_report(FaultPlan(kind="kill", at_s=4), plain_run("s3://b/p/run/step-00000002"), {}, None, True, 50)
    assert report["broken_rules"] == [] and report["passed"] is True
    assert report["newest_copy_before_fault"] == "s3://b/p/run/step-00000002"
    older = drill_report(FaultPlan(kind="kill", at_s=4), plain_run("s3://b/p/run/step-00000001"), {}, None, True, 50)
    assert older["passed"] is False and "not from the newest copy" in older["broken_rules"][0]
    damaged = plain_run("s3://b/p/run/step-00000001", damaged="run/step-00000002/ckpt.pt")
    report = drill_report(FaultPlan(kind="corrupt-checkpoint", at_s=4), damaged, {}, None, True, 50)
    assert report["newest_copy_before_fault"] == "s3://b/p/run/step-00000001" and report["passed"] is True


def test_the_newest_copy_the_injector_saw_counts_though_retention_removed_it_from_the_final_index():
    run = plain_run("s3://b/p/run/step-00000001")
    run["checkpoints"] = run["checkpoints"][2:]  # keep_last: only the copy made after the fault is left
    run["faults"][0]["detail"]["newest_copy"] = "s3://b/p/run/step-00000002"
    report = drill_report(FaultPlan(kind="kill", at_s=4), run, {}, None, True, 50)
    assert report["newest_copy_before_fault"] == "s3://b/p/run/step-00000002"
    assert report["passed"] is False and "not from the newest copy" in report["broken_rules"][0]


def test_a_fault_plan_names_its_moment():
    assert FaultPlan(kind="kill", at_s=25).moment == "at-25s"
    assert FaultPlan(kind="kill", at_step=30).moment == "at-step-30"


def test_a_rank_fault_at_a_time_needs_a_backend_that_names_a_plain_scripts_ranks():
    spec = on_backend("slurm")
    spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"mode": "plain"})})
    with pytest.raises(SpecError, match="^--fault kill: the slurm backend cannot name a plain script's rank"):
        check_plan(spec, FaultPlan(kind="kill", at_s=5))
    check_plan(spec, FaultPlan(kind="preempt", at_s=5))


def test_the_drill_flow_runs_state_is_its_verdict_and_carries_the_report():
    from flows.drill import drill_state

    passed = {
        "fault": "crash",
        "passed": True,
        "detected_kind": "CRASHED",
        "detection_latency_s": 0.02,
        "recovery_s": 1.5,
        "params_match_baseline": True,
    }
    state = drill_state(passed)
    assert state.is_completed() and state.result() is passed
    assert state.message == (
        "drill crash: PASSED: detected as CRASHED in 0.02s, recovered in 1.5s, final parameters equal to the baseline's"
    )
    failed = {"fault": "hang", "passed": False, "broken_rules": ["detected as CRASHED, expected HUNG", "x"]}
    state = drill_state(failed)
    assert state.is_failed() and state.result(raise_on_failure=False) is failed
    assert state.message == "drill hang: FAILED: detected as CRASHED, expected HUNG; x"


def test_a_plain_scripts_drill_says_what_it_did_not_time_or_compare(capsys):
    from trainflow.cli.drills import print_drill

    report = {
        "fault": "kill",
        "passed": True,
        "target": "rank 1 (pid 27268)",
        "detected_kind": "KILLED",
        "detection_latency_s": 0.097,
        "recovery_s": None,
        "torchrun_restart_s": 1.147,
        "at_s": 15.0,
        "injected_at_s": 15.006,
        "outcomes": ["KILLED", "SUCCEEDED"],
        "resumed_from": "checkpoints/nanogpt/run/step-00000008",
        "newest_copy_before_fault": "checkpoints/nanogpt/run/step-00000008",
        "params_match_baseline": None,
        "resources_released": True,
    }
    print_drill(report)
    printed = capsys.readouterr().out
    assert "recovery not timed (no steps reported) (torchrun alone: 1.147 s)" in printed
    assert "params match the baseline: not compared; resources released: True" in printed
    assert "None" not in printed


def sized(n: int, outcome: str, world_size: int, last_step: int, resumed_from: int, lost: int = 0) -> dict:
    return {**attempt(n, outcome, last_step, resumed_from, lost), "world_size": world_size}


GROW = {"permanent": True, "replaced_later": True}


def test_a_node_replaced_later_passes_once_the_job_shrank_and_grew_back_without_loss():
    run = summary(
        [sized(1, "NODE_LOST", 4, 70, 0, 20), sized(2, "RESIZED", 2, 110, 50), sized(3, "SUCCEEDED", 4, 200, 110)],
        params="bb" * 32,  # the shrunken attempt's math is not the baseline's
    )
    report = verdict("node-loss", run, **GROW)
    assert report["broken_rules"] == [] and report["world_sizes"] == [4, 2, 4]


@pytest.mark.parametrize(
    ("attempts", "broken"),
    [
        (
            [sized(1, "NODE_LOST", 4, 70, 0, 20), sized(2, "SUCCEEDED", 2, 200, 50)],
            "attempts were ['NODE_LOST', 'SUCCEEDED'], expected ['NODE_LOST', 'RESIZED', 'SUCCEEDED']",
        ),
        (
            [
                sized(1, "NODE_LOST", 4, 70, 0, 20),
                sized(2, "RESIZED", 2, 110, 50, 3),
                sized(3, "SUCCEEDED", 4, 200, 107),
            ],
            "growing back lost 3 step(s), expected 0",
        ),
        (
            [sized(1, "NODE_LOST", 4, 70, 0, 20), sized(2, "RESIZED", 2, 110, 50), sized(3, "SUCCEEDED", 2, 200, 110)],
            "world sizes were [4, 2, 2]: expected a shrink, then the first size back",
        ),
    ],
)
def test_a_node_replaced_later_fails_the_drill_unless_the_job_grows_back(attempts, broken):
    report = verdict("node-loss", summary(attempts), **GROW)
    assert broken in report["broken_rules"], report["broken_rules"]


def test_replaced_later_needs_a_permanent_node_loss_and_room_to_shrink():
    spec = RunSpec.model_validate(
        {
            "name": "grow",
            "workload": {"entrypoint": "examples/digits/train.py", "steps": 100},
            "resources": {"nodes": 2},
        }
    )
    with pytest.raises(SpecError, match="--replaced-later: only for --fault node-loss --permanent"):
        check_plan(spec, FaultPlan(kind="node-loss", replaced_later=True))
    with pytest.raises(SpecError, match="resources.min_nodes"):
        check_plan(spec, FaultPlan(kind="node-loss", permanent=True, replaced_later=True))


def recovered_in_place(
    kept: int = 2, restored: int = 70, failed: int = 70, replaced: int = 0, outcome: str = "INFRA"
) -> dict:
    row = {**attempt(1, "SUCCEEDED", 200, 0), "world_size": 2}
    row["in_place"] = [
        {
            "round": 1,
            "outcome": outcome,
            "failed_step": failed,
            "restored_step": restored,
            "failed_at": 5.01,
            "recovery_s": 0.08,
            "phases": {"abort_s": 0.002, "rejoin_s": 0.07, "restore_s": 0.002},
            "ranks_kept": kept,
            "ranks_replaced": replaced,
            "lost_steps": max(0, failed - 1 - restored),
        }
    ]
    return summary([row])


def in_place_verdict(run: dict, kind: str = "exception") -> dict:
    return drill_report(FaultPlan(kind=kind, at_step=70), run, BASELINE, 1.0, True, 50, in_process_restart=True)


def test_an_exception_recovered_in_place_reports_its_round_and_passes():
    report = in_place_verdict(recovered_in_place())
    assert report["broken_rules"] == [] and report["passed"] is True
    assert (report["detected_kind"], report["detection_latency_s"]) == ("INFRA", 0.01)
    assert (report["recovery_s"], report["recovery_vs_torchrun"], report["ranks_kept"]) == (0.08, 0.08, 2)
    assert (report["resumed_from_step"], report["lost_steps"]) == (70, 0)


@pytest.mark.parametrize(
    "run, broken",
    [
        (recovered_in_place(kept=1), "1 rank process(es) kept and 0 replaced, expected 2 kept and 0 replaced"),
        (recovered_in_place(restored=60), "lost 9 steps in place, more than the copies' interval (1)"),
        (summary([attempt(1, "INFRA", 70, 0), attempt(2, "SUCCEEDED", 200, 70)]), "no recovery in place was recorded"),
    ],
)
def test_an_exception_drill_with_in_process_restart_fails_unless_every_rank_went_on_in_place(run, broken):
    assert broken in in_place_verdict(run)["broken_rules"]


def test_a_crash_recovered_in_place_passes_with_the_dead_rank_replaced_and_the_other_kept():
    run = recovered_in_place(kept=1, replaced=1, outcome="CRASHED", failed=71)
    report = in_place_verdict(run, "crash")
    assert report["broken_rules"] == [] and report["passed"] is True
    assert (report["detected_kind"], report["ranks_kept"], report["ranks_replaced"]) == ("CRASHED", 1, 1)


@pytest.mark.parametrize(
    "run, broken",
    [
        (
            recovered_in_place(kept=2, outcome="CRASHED", failed=71),
            "2 rank process(es) kept and 0 replaced, expected 1 kept and 1 replaced",
        ),
        (recovered_in_place(kept=1, replaced=1, outcome="KILLED", failed=71), "detected as KILLED, expected CRASHED"),
    ],
)
def test_a_crash_drill_in_place_fails_unless_exactly_the_dead_rank_was_replaced(run, broken):
    assert broken in in_place_verdict(run, "crash")["broken_rules"]
