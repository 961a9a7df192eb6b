"""`make bench` in parts: only the parts asked for are measured, unknown ones are refused, and
BENCHMARKS.md renders from whatever parts bench/results.json holds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import run_benchmarks  # noqa: E402  (a script folder, not a package)


def test_only_the_parts_asked_for_are_run_and_unknown_ones_are_refused():
    assert run_benchmarks.chosen_parts([]) == list(run_benchmarks.PARTS)
    assert run_benchmarks.chosen_parts(["--only", "soak,fsdp_tp"]) == ["soak", "fsdp_tp"]
    with pytest.raises(SystemExit, match="unknown part.*bogus"):
        run_benchmarks.chosen_parts(["--only", "soak,bogus"])


def soak_report(passed: bool) -> dict:
    per_fault = [{"kind": "node-loss", "lost_steps": 12, "detected": "NODE_LOST"}]
    return {
        "faults": 1,
        "seed": 1,
        "steps": 100,
        "wall_s": 9.0,
        "kinds": ["node-loss"],
        "uptime_before": "b",
        "uptime_after": "a",
        "load": {"processes": 2, "niceness": 0},
        "passed": passed,
        "status": "succeeded",
        "confusion": [{"injected": "node-loss", "detected": "NODE_LOST", "count": 1}],
        "per_fault": per_fault,
        "params_match_baseline": True,
        "misclassified": [],
        "unexplained_attempts": [],
        "successes_recorded_as_failures": [],
        "late_injections": [],
        "over_lost": [],
        "leftovers": [],
        "kinds_not_soaked": {"straggler": "no attempt ends"},
    }


def test_benchmarks_md_renders_the_new_parts_without_the_others():
    results = {
        "machine": "host: test",
        "soak": {"measured_at": "t", "cores": 2, "main": soak_report(True), "storage": {"error": "moto did not start"}},
        "fsdp_tp": {"error": "the run failed", "measured_at": "t"},
    }
    text = run_benchmarks.render(results)
    assert "| node-loss | 1 | 12 |" in text  # the confusion matrix row with its lost steps
    assert "not soaked here: straggler" in text and "not measured: moto did not start" in text
    assert "FSDP2 + TP" in text and "the run failed" in text
    assert "## Orchestration tax (reference workload" not in text  # not measured, not invented


def test_the_reference_goodput_section_gives_the_goodput_against_its_target():
    import reference_goodput

    figures = {
        "status": "succeeded",
        "goodput": 0.9312,
        "target": 0.9,
        "met": True,
        "faults": [["crash", 600]],
        "outcomes": ["CRASHED", "SUCCEEDED"],
        "steps": 2400,
        "hidden": 1024,
        "global_batch": 512,
        "checkpoint_every_steps": 50,
        "mean_step_time_s": 0.071,
        "wall_s": 190.0,
        "productive_s": 176.9,
        "lost_steps": 20,
        "lost_work_s": 1.4,
        "detection_s_total": 0.1,
        "recovery_s_total": 1.2,
        "checkpoint_stall_total_s": 0.5,
        "other_s": 9.9,
        "recovery_s": [1.2],
        "device_hours": 0.1,
        "wasted_device_hours": 0.001,
    }
    in_place = {**figures, "goodput": 0.9615, "target": 0.97, "met": False, "outcomes": ["SUCCEEDED"]}
    in_place["in_place"] = ["CRASHED at step 601"]
    text = "\n".join(reference_goodput.markdown({"restart": figures, "in_place": in_place}))
    assert "| figure | restart of the whole job | `in_process_restart` |" in text
    assert "| goodput | 0.931 (target ≥ 0.90: met) | 0.962 (target ≥ 0.97: not met) |" in text
    assert "| recovered in place | – | CRASHED at step 601 |" in text
    assert "(71 ms steps here)" in text and "every 3.5 s" in text
    # a result recorded before the drill ran twice reads as the restart's alone
    assert "| goodput | 0.931 (target ≥ 0.90: met) |" in "\n".join(reference_goodput.markdown(figures))
    assert "not measured" in "\n".join(reference_goodput.markdown({"restart": {"error": "boom"}}))
