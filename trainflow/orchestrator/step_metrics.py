"""Per-step metrics at a rate a tracking store can take.

A step of a small model can take milliseconds; recording five metrics for each of them would cost
the tracking store more CPU than the training it describes. Steps that come faster than the
interval are recorded as one row per metric, at the last step of the interval, with its time.
Slower steps are recorded one by one. The final step of the run is always a row of its own, so
the last `loss` point is the final step's loss (`final_loss`).

How a metric is aggregated over an interval (a step's `loss` is already the mean over the ranks,
rank_steps.py; every other metric is rank 0's, as its script logged it):
- `loss` and trainflow's own per-step timings (`step_time_s`, `comm_wait_s`, `data_wait_s`,
  `samples_per_s`): the mean of the interval's steps;
- the metrics a spec names in `tracking.mean_metrics`: likewise;
- anything else (a learning rate, a checkpoint's timings): the last value reported in the
  interval, a value the script really logged.
Nothing is dropped from the run's figures: the ledger sums every step before this.
"""

from __future__ import annotations

MetricRows = list[tuple[str, float, int, float]]

MEAN_METRICS = ("loss", "step_time_s", "comm_wait_s", "data_wait_s", "samples_per_s")


class StepMetricWindow:
    def __init__(self, every_s: float, mean_metrics: tuple[str, ...] = (), final_step: int | None = None):
        self.every_s = every_s
        self.mean_metrics = frozenset(MEAN_METRICS) | frozenset(mean_metrics)
        self.final_step = final_step
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._latest: dict[str, float] = {}
        self._last: tuple[int, float] | None = None
        self._recorded_at = float("-inf")

    def add(self, step: int, t: float, metrics: dict[str, float]) -> MetricRows:
        """This step's metrics; returns the rows to record now (none while a window is open)."""
        rows = self.close() if step == self.final_step else []
        for key, value in metrics.items():
            self._sums[key] = self._sums.get(key, 0.0) + value
            self._counts[key] = self._counts.get(key, 0) + 1
            self._latest[key] = value
        self._last = (step, t)
        # an interval of 0 records every step, whatever its time: the last step of an attempt that
        # not every rank reported is joined at the end, and may carry an earlier time than the
        # row recorded before it
        if self.every_s <= 0 or t - self._recorded_at >= self.every_s or step == self.final_step:
            rows += self.close()
        return rows

    def close(self) -> MetricRows:
        """The rows of the open window, if any (at the end of an attempt, so its last step is recorded)."""
        if self._last is None:
            return []
        step, t = self._last
        rows = [
            (key, self._sums[key] / self._counts[key] if key in self.mean_metrics else self._latest[key], step, t)
            for key in self._sums
        ]
        self._sums, self._counts, self._latest, self._last = {}, {}, {}, None
        self._recorded_at = t
        return rows
