"""The terminal progress line: what the watcher publishes is what the CLI draws."""

from __future__ import annotations

import time

from trainflow.orchestrator import progress


def test_published_progress_has_step_loss_attempt_and_an_eta():
    progress.publish(10, 100, attempt=2, loss=0.5)
    time.sleep(0.05)
    progress.publish(20, 100, attempt=2, loss=None)
    now = progress.current()
    assert (now.step, now.total, now.attempt, now.loss) == (20, 100, 2, 0.5)  # the last known loss stays
    eta = now.eta_s()
    assert eta is not None and 0 < eta < 10  # 80 steps left at the rate of the last 10


def test_a_new_attempt_restarts_the_rate():
    progress.publish(50, 100, attempt=3, loss=1.0)
    assert progress.current().eta_s() is None  # no steps done yet in this attempt


def test_a_step_behind_the_last_one_is_another_run_and_restarts_the_rate():
    progress.publish(90, 100, attempt=4, loss=1.0)
    progress.publish(5, 100, attempt=4, loss=1.0)  # the next run in this process, also at its 4th attempt
    assert progress.current().step == 5 and progress.current().eta_s() is None


def test_the_bar_says_starting_until_the_first_step():
    assert progress.steps_text(progress.Progress()) == "starting…"
    assert progress.steps_text(progress.Progress(step=20, total=60)) == "step 20/60"
