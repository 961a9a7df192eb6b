"""One attempt's metrics on their way to the tracking store, and the totals the ledger sums.

Every rank's step reports are joined per step (rank_steps.py: the loss is the mean over ranks),
then recorded per interval (step_metrics.py: the loss is the mean over the interval's steps). The
totals (step, communication and data-wait times, steps) are rank 0's, counted as its reports
arrive, so an attempt's totals never wait for a rank that stopped reporting.
"""

from __future__ import annotations

from trainflow.contracts.status_protocol import StepSum
from trainflow.orchestrator.rank_steps import StepReport, StepsOverRanks
from trainflow.orchestrator.step_metrics import MetricRows, StepMetricWindow

TIMING_TOTALS = ("step_time_s", "comm_wait_s", "data_wait_s")


class AttemptMetrics:
    def __init__(self, world_size: int, every_s: float, mean_metrics: tuple[str, ...], final_step: int | None):
        self.totals: dict[str, float] = {}
        self._steps = StepsOverRanks(world_size)
        self._window = StepMetricWindow(every_s, mean_metrics, final_step)
        self._rows: MetricRows = []

    def add_step(self, report: StepReport | StepSum) -> None:
        metrics = {k: v for k, v in (report.metrics or {}).items() if v is not None}
        for key in TIMING_TOTALS:
            if key in metrics:
                self.totals[key] = self.totals.get(key, 0.0) + metrics[key]
        if report.metrics is not None:
            self.totals["steps"] = self.totals.get("steps", 0) + ("step_time_s" in metrics)
        for step, t, figures in self._steps.add(report):
            self._rows.extend(self._window.add(step, t, figures))

    def add_figures(self, step: int, t: float, figures: dict[str, float]) -> None:
        """Figures that are no rank's step (a node's resources): recorded as they come, beside the
        steps' window. Through it, a node's report would close the open interval, and a step joined
        later with an earlier time would be merged into the next step's row."""
        self._rows.extend((key, value, step, t) for key, value in figures.items())

    def add_rows(self, rows: MetricRows) -> None:
        self._rows.extend(rows)

    def close(self) -> None:
        """The attempt ended: the steps not every rank reported, then the open interval."""
        for step, t, figures in self._steps.close():
            self._rows.extend(self._window.add(step, t, figures))
        self._rows.extend(self._window.close())

    def take(self) -> MetricRows:
        rows, self._rows = self._rows, []
        return rows
