from trainflow.orchestrator.attempt_metrics import AttemptMetrics
from trainflow.orchestrator.rank_steps import StepReport


def losses(metrics: AttemptMetrics) -> list[tuple[int, float]]:
    return [(step, value) for key, value, step, _ in metrics.take() if key == "loss"]


def test_a_nodes_figures_never_merge_the_steps_around_them_into_one_row():
    # rank 1's report of step 11 arrives after node 0's resources, which carry a later time than
    # rank 0's step: step 11 is still a row of its own, with its own loss
    metrics = AttemptMetrics(world_size=2, every_s=0.0, mean_metrics=(), final_step=20)
    metrics.add_step(StepReport(0, 11, 4.0, 1.0, {"loss": 1.0}))
    metrics.add_figures(10, 5.0, {"system/node_0/cpu_percent": 80.0})
    metrics.add_step(StepReport(1, 11, 4.1, 3.0))
    metrics.add_step(StepReport(0, 12, 6.0, 0.5, {"loss": 0.5}))
    metrics.add_step(StepReport(1, 12, 6.1, 0.5))
    rows = metrics.take()
    assert ("system/node_0/cpu_percent", 80.0, 10, 5.0) in rows
    assert [(step, value) for key, value, step, _ in rows if key == "loss"] == [(11, 2.0), (12, 0.5)]


def test_the_steps_an_attempt_ended_without_are_each_recorded_with_an_interval_of_zero():
    # a node was lost: its ranks never reported steps 11 and 12, and a node's figures came between
    metrics = AttemptMetrics(world_size=4, every_s=0.0, mean_metrics=(), final_step=20)
    metrics.add_step(StepReport(0, 11, 4.0, 1.0, {"loss": 1.0}))
    metrics.add_step(StepReport(0, 12, 4.5, 0.8, {"loss": 0.8}))
    metrics.add_figures(12, 9.0, {"system/node_0/cpu_percent": 80.0})
    assert losses(metrics) == []
    metrics.close()
    assert losses(metrics) == [(11, 1.0), (12, 0.8)]
