"""Per-step metrics at a rate a tracking store can take.

A step of a small model can take milliseconds; recording five metrics for each of them would cost
the tracking store more CPU than the training it describes. Steps that come faster than the
interval are recorded as one row per metric: their mean, at the last of them, with its time.
Slower steps are recorded one by one. Nothing is dropped from the totals (goodput, diagnosis):
they are summed from every step before this.
"""

from __future__ import annotations

MetricRows = list[tuple[str, float, int, float]]


class StepMetricWindow:
    def __init__(self, every_s: float):
        self.every_s = every_s
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._last: tuple[int, float] | None = None
        self._recorded_at = float("-inf")

    def add(self, step: int, t: float, metrics: dict[str, float]) -> MetricRows:
        """This step's metrics; returns the rows to record now (none while a window is open)."""
        for key, value in metrics.items():
            self._sums[key] = self._sums.get(key, 0.0) + value
            self._counts[key] = self._counts.get(key, 0) + 1
        self._last = (step, t)
        if t - self._recorded_at >= self.every_s:
            return self.close()
        return []

    def close(self) -> MetricRows:
        """The rows of the open window, if any (at the end of an attempt, so its last step is recorded)."""
        if self._last is None:
            return []
        step, t = self._last
        rows = [(key, total / self._counts[key], step, t) for key, total in self._sums.items()]
        self._sums, self._counts, self._last = {}, {}, None
        self._recorded_at = t
        return rows
