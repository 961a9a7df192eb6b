from trainflow.orchestrator.step_metrics import StepMetricWindow


def test_fast_steps_are_recorded_as_their_mean_at_the_last_step_of_each_interval():
    window = StepMetricWindow(every_s=0.1)
    rows = []
    for step in range(1, 11):  # ten steps, 30 ms apart
        rows += window.add(step, 100.0 + 0.03 * step, {"loss": float(step), "step_time_s": 0.03})
    rows += window.close()
    loss = [(step, value) for key, value, step, _ in rows if key == "loss"]
    # the first step opens the record; then one row per 0.1 s; the last step always closes it
    assert loss == [(1, 1.0), (5, 3.5), (9, 7.5), (10, 10.0)]
    assert all(value == 0.03 for key, value, _, _ in rows if key == "step_time_s")
    assert {t for key, _, step, t in rows if step == 10} == {100.3}


def test_slow_steps_and_an_interval_of_zero_record_every_step():
    for every_s, gap in ((0.1, 0.5), (0.0, 0.001)):
        window = StepMetricWindow(every_s)
        rows = [row for step in range(1, 6) for row in window.add(step, step * gap, {"loss": 1.0 / step})]
        assert [step for _, _, step, _ in rows] == [1, 2, 3, 4, 5]
        assert window.close() == []


def test_a_metric_seen_once_in_an_interval_keeps_its_value():
    window = StepMetricWindow(every_s=1.0)
    window.add(1, 0.0, {"loss": 2.0})
    window.add(2, 0.1, {"loss": 1.0, "checkpoint_stage_s": 0.25})
    rows = window.add(3, 0.2, {"loss": 0.0}) + window.close()
    assert ("checkpoint_stage_s", 0.25, 3, 0.2) in rows
    assert ("loss", 0.5, 3, 0.2) in rows


def test_a_learning_rate_is_never_averaged_unless_the_spec_asks():
    window = StepMetricWindow(every_s=1.0)
    window.add(1, 0.0, {"lr": 0.1, "accuracy": 0.5})  # the first step is a row of its own
    window.add(2, 0.1, {"lr": 0.1, "accuracy": 0.6})
    rows = window.add(3, 0.2, {"lr": 0.05, "accuracy": 0.8}) + window.close()
    assert ("lr", 0.05, 3, 0.2) in rows and ("accuracy", 0.8, 3, 0.2) in rows  # values the script logged
    averaging = StepMetricWindow(every_s=1.0, mean_metrics=("accuracy",))
    averaging.add(1, 0.0, {"accuracy": 0.5})
    averaging.add(2, 0.1, {"accuracy": 0.6})
    rows = averaging.add(3, 0.2, {"accuracy": 0.8}) + averaging.close()
    assert ("accuracy", 0.7, 3, 0.2) in [(k, round(v, 6), s, t) for k, v, s, t in rows]


def test_the_final_step_is_a_point_of_its_own():
    window = StepMetricWindow(every_s=10.0, final_step=4)
    rows = []
    for step in range(1, 5):
        rows += window.add(step, 0.01 * step, {"loss": float(step)})
    loss = [(step, value) for key, value, step, _ in rows if key == "loss"]
    assert loss == [(1, 1.0), (3, 2.5), (4, 4.0)]  # the last point is the final step's loss: final_loss
    assert window.close() == []


def test_an_interval_of_zero_records_a_step_whose_time_is_earlier_than_the_row_before():
    window = StepMetricWindow(every_s=0.0)
    rows = window.add(11, 5.0, {"loss": 2.0}) + window.add(12, 4.0, {"loss": 1.0})  # joined late at the end
    assert [(key, value, step) for key, value, step, _ in rows] == [("loss", 2.0, 11), ("loss", 1.0, 12)]
