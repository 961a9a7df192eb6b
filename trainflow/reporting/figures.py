"""A run's summary figures as MLflow metrics: one point each, under `summary/`, so the MLflow UI
lists the step series (loss, step_time_s) first and the figures after them."""

from __future__ import annotations

SUMMARY_PREFIX = "summary/"


def summary_metric_rows(figures: dict[str, float], step: int, at: float) -> list[tuple[str, float, int, float]]:
    """The figures as metric rows (key, value, step, unix time), each under `summary/`."""
    return [(SUMMARY_PREFIX + key, value, step, at) for key, value in figures.items()]


def summary_figures(metrics: dict[str, float]) -> dict[str, float]:
    """A run's metrics with its summary figures also by their own names (`goodput` for
    `summary/goodput`); runs recorded before the namespace have them there already."""
    return {
        **metrics,
        **{k.removeprefix(SUMMARY_PREFIX): v for k, v in metrics.items() if k.startswith(SUMMARY_PREFIX)},
    }
