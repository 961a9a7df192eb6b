"""The verdicts of drills, soaks and reruns as the Prefect artifacts and MLflow tags show them."""

from __future__ import annotations

from trainflow.reporting.verdicts import (
    artifact_key,
    drill_markdown,
    drill_tags,
    rerun_markdown,
    rerun_tags,
    rerun_verdict,
    soak_markdown,
)

HASH = "ab" * 32


def test_the_drill_table_shows_the_verdict_broken_rules_and_every_figure():
    report = {
        "fault": "crash",
        "passed": False,
        "broken_rules": ["recovery took 40 s"],
        "params_match_baseline": True,
        "outcomes": ["CRASHED", "SUCCEEDED"],
        "reason": "a | b",
        "recovery_s": None,
    }
    text = drill_markdown(report)
    assert text.startswith("# Drill crash: FAILED\n") and "- recovery took 40 s" in text
    assert "| params_match_baseline | true |" in text and '| outcomes | ["CRASHED", "SUCCEEDED"] |' in text
    assert "| reason | a \\| b |" in text and "| recovery_s | – |" in text
    assert drill_tags(report) == {
        "drill_fault": "crash",
        "drill_verdict": "FAILED",
        "drill_params_match_baseline": "true",
    }


def test_a_rerun_says_drift_or_none_and_whether_the_parameters_match():
    summary = {
        "rerun_of": "f" * 32,
        "drift": [],
        "params_sha256": HASH,
        "original_params_sha256": HASH,
        "status": "succeeded",
        "mlflow_run_id": "e" * 32,
    }
    verdict = rerun_verdict(summary)
    assert verdict["verdict"] == f"no drift; params_sha256 {HASH} = the original's"
    assert rerun_tags(verdict) == {"rerun_verdict": verdict["verdict"], "rerun_params_match_original": "true"}
    assert "| Drift | none |" in rerun_markdown(summary, verdict)
    drifted = rerun_verdict({**summary, "drift": ["torch 2.5 != 2.4"], "params_sha256": "cd" * 32})
    assert drifted["verdict"] == f"drift: torch 2.5 != 2.4; params_sha256 {'cd' * 32} ≠ the original's ({HASH})"
    assert not drifted["params_match_original"]
    assert "not comparable" in rerun_verdict({**summary, "params_sha256": None})["verdict"]


def test_soak_table_and_artifact_keys():
    report = {
        "faults": 2,
        "passed": True,
        "per_fault": [
            {
                "kind": "crash",
                "attempt": 1,
                "at_step": 5,
                "injected_at_step": 5,
                "detected": "CRASHED",
                "expected": "CRASHED",
                "lost_steps": 1,
            }
        ],
        "confusion": [],
        "params_match_baseline": True,
    }
    text = soak_markdown(report, "matrix")
    assert text.startswith("# Soak of 2 faults: PASSED") and "| crash | 1 | 5 | 5 | CRASHED | CRASHED | 1 |" in text
    assert artifact_key("My_Job", "drill", "storage-outage") == "my-job-drill-storage-outage"
