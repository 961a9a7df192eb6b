"""The loss of a step is the mean over the ranks, and a step's row waits for every rank's report."""

from trainflow.orchestrator.rank_steps import StepReport, StepsOverRanks


def test_a_step_is_recorded_once_every_rank_reported_it_with_the_mean_of_their_losses():
    steps = StepsOverRanks(world_size=2)
    # rank 1's reports may come before rank 0's or after: the row is the same
    assert steps.add(StepReport(1, 1, 10.0, loss=3.0)) == []
    assert steps.add(StepReport(0, 1, 10.1, loss=1.0, metrics={"loss": 1.0, "lr": 0.1})) == [
        (1, 10.1, {"lr": 0.1, "loss": 2.0})
    ]
    assert steps.add(StepReport(0, 2, 10.2, loss=0.5, metrics={"loss": 0.5, "lr": 0.1})) == []
    assert steps.add(StepReport(1, 2, 10.3, loss=1.5)) == [(2, 10.2, {"lr": 0.1, "loss": 1.0})]
    assert steps.close() == []


def test_a_rank_that_logs_no_loss_is_left_out_of_the_mean_but_still_completes_the_step():
    steps = StepsOverRanks(world_size=3)
    steps.add(StepReport(0, 1, 1.0, loss=2.0, metrics={"loss": 2.0}))
    steps.add(StepReport(2, 1, 1.0))
    assert steps.add(StepReport(1, 1, 1.0, loss=4.0)) == [(1, 1.0, {"loss": 3.0})]


def test_steps_an_attempt_ended_before_every_rank_reported_say_how_many_ranks_their_mean_used():
    steps = StepsOverRanks(world_size=2)
    steps.add(StepReport(0, 1, 1.0, loss=1.0, metrics={"loss": 1.0, "step_time_s": 0.1}))
    steps.add(StepReport(1, 1, 1.0, loss=3.0))
    steps.add(StepReport(0, 2, 2.0, loss=1.0, metrics={"loss": 1.0, "step_time_s": 0.1}))
    steps.add(StepReport(1, 3, 3.0, loss=5.0))  # rank 1's report of step 2 never came
    assert steps.close() == [
        (2, 2.0, {"step_time_s": 0.1, "loss": 1.0, "loss_ranks": 1.0}),
        (3, 3.0, {"loss": 5.0, "loss_ranks": 1.0}),
    ]
