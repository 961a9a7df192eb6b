"""Straggler scoring: a rank whose compute time stays above a factor of the other ranks' median.

Compute time is a step's time minus its wait in all-reduce, so the ranks that wait for a slow one
do not look slow themselves. Reported (an event, a score per rank as a metric), never fatal.
"""

from __future__ import annotations

import statistics
import time

from trainflow.orchestrator.status import AttemptStatus
from trainflow.orchestrator.step_metrics import MetricRows

STRAGGLER_REPORT_S = 5.0


class StragglerWatch:
    def __init__(self, factor: float, steps: int):
        self.factor = factor
        self.steps = steps
        self.stragglers: dict[int, dict] = {}  # rank -> the report that named it
        self._straggling: dict[int, int] = {}
        self._scored_at = time.monotonic()

    def check(self, status: AttemptStatus) -> tuple[list[dict], MetricRows]:
        """The ranks newly found straggling (their reports), and the scores due for recording: a
        rank straggles once its mean compute time was above the factor times the others' median
        for `steps` checks in a row."""
        window = max(4 * self.steps, 20)
        recent = {r.rank: list(r.compute_s)[-window:] for r in status.ranks.values() if len(r.compute_s) >= window}
        if len(recent) < 2:
            return [], []
        means = {rank: statistics.fmean(values) for rank, values in recent.items()}
        scores, found = {}, []
        for rank in recent:
            others = statistics.median(m for r, m in means.items() if r != rank)
            if others <= 0:
                continue
            scores[rank] = means[rank] / others
            above = scores[rank] > self.factor
            self._straggling[rank] = self._straggling.get(rank, 0) + 1 if above else 0
            if rank not in self.stragglers and self._straggling[rank] >= self.steps:
                report = {"kind": "straggler", "rank": rank, "node": status.ranks[rank].node,
                          "score": round(scores[rank], 2), "step": status.ranks[rank].step, "t": time.time()}
                self.stragglers[rank] = report
                found.append(report)
        rows: MetricRows = []
        if time.monotonic() - self._scored_at > STRAGGLER_REPORT_S:
            step, now = status.max_step(), time.time()
            rows = [(f"straggler_score_rank_{r}", s, step, now) for r, s in scores.items()]
            self._scored_at = time.monotonic()
        return found, rows
