"""The `trainflow.attempt.recovered` event says what the summary says: the first step of the attempt
after a failure, and the recovery from the failure's detection to that step."""

from __future__ import annotations

from types import SimpleNamespace

from trainflow.prefect import ui


def test_recovered_names_the_first_step_and_the_time_to_it(monkeypatch):
    emitted = []
    monkeypatch.setattr(ui, "_emit", lambda event, record, payload: emitted.append((event, payload)))
    record = SimpleNamespace(run_id="digits-x")
    report = ui.RunReport("digits", 60, failure_detected_at=100.0)
    monkeypatch.setitem(ui._reports, "digits-x", report)
    # a node's figures sit at step 0; the attempt resumed from step 20 and its first step is 21
    rows = [("system/node_0/cpu_percent", 50.0, 0, 107.0), ("loss", 0.9, 21, 108.25), ("loss", 0.8, 22, 108.5)]
    ui.report_progress(record, 2, rows)
    assert emitted == [(ui.ATTEMPT_RECOVERED, {"attempt": 2, "step": 21, "recovery_s": 8.25})]
    ui.report_progress(record, 2, [("loss", 0.7, 23, 109.0)])
    assert len(emitted) == 1  # once an attempt
