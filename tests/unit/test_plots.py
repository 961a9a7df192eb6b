"""trainflow.reporting.plots: what the pictures show (spans, figures) for a hand-made run, and that they render."""

from __future__ import annotations

import struct

import pytest

from trainflow.contracts import AttemptResult, Outcome, RunSummary, run_ledger
from trainflow.reporting.plots import picture_titles, render_run_plots
from trainflow.reporting.plots.data import (
    DETECTION,
    LOST,
    OTHER,
    PRODUCTIVE,
    RECOVERY,
    STALLS,
    checkpoint_timings,
    curves_by_attempt,
    goodput_breakdown,
    timeline_data,
)
from trainflow.reporting.plots.render import (
    draw_goodput,
    draw_timeline,
    figure_texts,
    new_figure,
    render_goodput,
    render_timeline,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = 1_800_000_000.0
STEP_S = 0.1


def crash_then_success() -> tuple[dict, dict]:
    """Attempt 1 trains steps 1-17 and crashes (checkpoints at 5, 10, 15); attempt 2 resumes from 15
    and finishes 30 (checkpoints at 20, 25, 30). Retention kept the last three. Steps take 0.1 s;
    the saves at 5, 10, 15, 20 and 25 stalled training 0.02 s each."""
    results = [
        AttemptResult(
            attempt=1,
            outcome=Outcome.CRASHED,
            reason="rank 1 was killed",
            world_size=2,
            started_at=T0,
            ended_at=T0 + 6.0,
            detected_at=T0 + 5.5,
            failed_at=T0 + 5.2,
            last_step=17,
            resumed_from_step=0,
            first_step_at=T0 + 3.0,
            totals={"steps": 17, "step_time_s": 1.7, "checkpoint_stall_s": 0.06},
        ),
        AttemptResult(
            attempt=2,
            outcome=Outcome.SUCCEEDED,
            reason="finished",
            world_size=2,
            started_at=T0 + 7.0,
            ended_at=T0 + 20.0,
            detected_at=T0 + 20.0,
            failed_at=None,
            last_step=30,
            resumed_from_step=15,
            first_step_at=T0 + 15.0,
            totals={"steps": 15, "step_time_s": 1.5, "checkpoint_stall_s": 0.04},
        ),
    ]
    ledger = run_ledger(results, world_size=2)
    summary = RunSummary(
        status="succeeded",
        reason="finished",
        run_id="digits-test-run",
        mlflow_run_id="0123456789abcdef",
        tracking_uri="sqlite:///mlflow.db",
        experiment="digits",
        prefect_flow_run_id="",
        final_step=30,
        total_steps=30,
        final_loss=0.8,
        params_sha256=None,
        checkpoints=[{"step": s, "uri": f"/ckpt/step-{s}", "verified": True} for s in (20, 25, 30)],
        snapshots_failed=[],
        attempts=ledger.attempts,
        stragglers=[],
        goodput=ledger.figures.goodput,
        features_off=[],
        costs=ledger.figures,
        diagnosis=[],
    ).as_json_dict()
    # attempt 1 steps at T0+3.0 .. T0+4.6, attempt 2 steps 16-30 from T0+15.0
    steps = [(s, T0 + 3.0 + (s - 1) * STEP_S) for s in range(1, 18)]
    steps += [(s, T0 + 15.0 + (s - 16) * STEP_S) for s in range(16, 31)]
    histories = {
        "step_time_s": [(s, STEP_S, t) for s, t in steps],
        "loss": [(s, 2.3 - 0.05 * s, t) for s, t in steps],
        "checkpoint_bytes": [(s, 3e5, t + 0.05) for s, t in steps if s % 5 == 0 and not (s == 15 and t > T0 + 10)],
        "checkpoint_stall_s": [(s + 1, 0.02, t + STEP_S) for s, t in steps if s % 5 == 0 and s < 30],
        "checkpoint_stage_s": [(s, 0.02, t + 0.05) for s, t in steps if s % 5 == 0],
        "checkpoint_upload_s": [(s, 0.01, t + 0.05) for s, t in steps if s % 5 == 0],
    }
    return summary, histories


def test_timeline_spans_detection_and_recovery():
    timeline = timeline_data(*crash_then_success())
    first, second = timeline.attempts
    assert (first.start_s, first.end_s, first.detected_s) == (0.0, 6.0, 5.5)
    assert (second.start_s, second.end_s, second.detected_s) == (7.0, 20.0, None)
    assert (first.outcome, second.outcome) == ("CRASHED", "SUCCEEDED")
    assert (second.resumed_from_step, second.last_step) == (15, 30)
    # recovery: from attempt 1's detection to attempt 2's first step
    [recovery] = timeline.recoveries
    assert recovery.attempt == 2
    assert recovery.start_s == pytest.approx(5.5) and recovery.end_s == pytest.approx(15.0)
    assert recovery.seconds == pytest.approx(9.5)
    assert timeline.wall_s == 20.0


def test_timeline_checkpoints_and_progress():
    timeline = timeline_data(*crash_then_success())
    assert [(c.step, c.kept) for c in timeline.checkpoints] == [
        (5, False),
        (10, False),
        (15, False),
        (20, True),
        (25, True),
        (30, True),
    ]
    assert timeline.checkpoints[0].at_s == pytest.approx(3.0 + 4 * STEP_S + 0.05)
    steps = [s for _, s in timeline.progress]
    assert steps[:17] == list(range(1, 18)) and steps[17:] == list(range(16, 31))  # the retry redoes 16 and 17
    assert all(a <= b for (a, _), (b, _) in zip(timeline.progress, timeline.progress[1:]))


def test_timeline_without_commit_times_places_kept_checkpoints_at_their_step():
    summary, histories = crash_then_success()
    del histories["checkpoint_bytes"]
    timeline = timeline_data(summary, histories)
    assert [c.step for c in timeline.checkpoints] == [20, 25, 30]
    assert timeline.checkpoints[-1].at_s == pytest.approx(15.0 + 14 * STEP_S)


def test_goodput_breakdown_is_the_ledgers():
    summary, _ = crash_then_success()
    breakdown = goodput_breakdown(summary)
    assert breakdown.mean_step_s == pytest.approx(STEP_S)
    assert breakdown.seconds(PRODUCTIVE) == pytest.approx(30 * STEP_S)  # 30 steps count toward the model
    assert breakdown.seconds(LOST) == pytest.approx(2 * STEP_S)  # steps 16 and 17 were redone
    assert breakdown.seconds(DETECTION) == pytest.approx(0.3)
    assert breakdown.seconds(RECOVERY) == pytest.approx(9.5)
    assert breakdown.seconds(STALLS) == pytest.approx(5 * 0.02)
    assert breakdown.seconds(OTHER) == pytest.approx(20.0 - 3.0 - 0.2 - 0.3 - 9.5 - 0.1)
    assert sum(s.seconds for s in breakdown.segments) == pytest.approx(breakdown.wall_s) == pytest.approx(20.0)
    assert breakdown.goodput == summary["goodput"] == 0.15


def test_the_goodput_picture_prints_the_ledgers_figures():
    summary, histories = crash_then_success()
    figure = new_figure()
    draw_goodput(figure, goodput_breakdown(summary))
    texts = figure_texts(figure)
    title = figure.get_suptitle()
    assert "goodput 15.0% of 20.0 s, mean step 100.0 ms" in title
    assert title == picture_titles(summary)["goodput.png"]
    assert "3.00 s  (15.0%)" in texts  # productive training: the goodput again, to the digit
    assert "0.10 s  (0.5%)" in texts  # checkpoint stalls: the ledger's total
    assert "15.0%" in texts  # the wall-time bar's productive share (its name does not fit): same digits


def test_the_timeline_counts_steps_not_points():
    summary, histories = crash_then_success()
    sparse = {key: points[::4] for key, points in histories.items()}  # recorded once per interval
    figure = new_figure()
    draw_timeline(figure, timeline_data(summary, sparse))
    texts = figure_texts(figure)
    assert any("CRASHED: steps 0 to 17, 2 lost (17 steps, 1.70 s of step time)" in t for t in texts)
    assert any("SUCCEEDED: steps 15 to 30 (15 steps, 1.50 s of step time)" in t for t in texts)


def test_curves_split_by_attempt_with_the_failure_step():
    summary, histories = crash_then_success()
    first, second = curves_by_attempt(summary, histories["loss"])
    assert first.steps == tuple(range(1, 18)) and first.failed_at_step == 17
    assert second.steps == tuple(range(16, 31)) and second.failed_at_step is None
    assert first.values[0] == pytest.approx(2.25)


def test_checkpoint_timings_per_committed_step():
    _, histories = crash_then_success()
    timings = checkpoint_timings(histories)
    assert list(timings) == [5, 10, 15, 20, 25, 30]
    assert timings[20] == {"stage_s": 0.02, "upload_s": 0.01}


def test_no_attempts_is_refused_with_the_run_named():
    with pytest.raises(ValueError, match="digits-x"):
        timeline_data({**crash_then_success()[0], "run_id": "digits-x", "attempts": []}, {})


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk follows the signature
    return width, height


def test_pictures_render_as_png(tmp_path):
    summary, histories = crash_then_success()
    timeline = render_timeline(timeline_data(summary, histories), tmp_path / "a" / "timeline.png")
    goodput = render_goodput(goodput_breakdown(summary), tmp_path / "a" / "goodput.png")
    for path in (timeline, goodput):
        assert path.stat().st_size > 10_000
        assert png_size(path) == (1200, 500)


@pytest.mark.parametrize("draw, shape", [(draw_timeline, timeline_data), (draw_goodput, goodput_breakdown)])
def test_titles_with_real_ids_fit_the_picture(draw, shape):
    summary, histories = crash_then_success()
    summary.update(run_id="digits-20261129-141548-d46749", mlflow_run_id="7832fc152f644fdc86754d1183a33f45")
    figure = new_figure()
    draw(figure, shape(summary, histories) if shape is timeline_data else shape(summary))
    figure.draw_without_rendering()
    title = figure.get_suptitle()
    assert summary["run_id"] in title and summary["mlflow_run_id"] in title
    extent = figure._suptitle.get_window_extent()
    assert 0 <= extent.x0 and extent.x1 <= figure.bbox.width


def test_run_plots_render_without_metric_histories(tmp_path):
    summary, _ = crash_then_success()
    paths = render_run_plots(summary, {}, tmp_path)
    assert [p.name for p in paths] == ["timeline.png", "goodput.png"]
    assert all(png_size(p) == (1200, 500) for p in paths)
