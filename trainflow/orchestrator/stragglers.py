"""Straggler scoring: a rank whose compute time stays above a factor of the other ranks' median.

Compute time is a step's time minus its wait in all-reduce, so the ranks that wait for a slow one
do not look slow themselves. Reported (an event, a score per rank as a metric), never fatal.

Scored from one sort of the ranks' mean compute times (O(N log N)): at every check for a job of up
to SCORED_AT_EVERY_CHECK ranks, else at most every `ranks / RANKS_SCORED_PER_S` seconds (capped at
SCORE_EVERY_MAX_S), every few seconds for one of thousands of ranks.
"""

from __future__ import annotations

import bisect
import time

from trainflow.contracts.evidence import Straggler
from trainflow.orchestrator.step_metrics import MetricRows

STRAGGLER_REPORT_S = 5.0
RANKS_SCORED_PER_S = 4096
SCORED_AT_EVERY_CHECK = 512
SCORE_EVERY_MAX_S = 4.0


class StragglerWatch:
    def __init__(self, factor: float, steps: int):
        self.factor = factor
        self.steps = steps
        self.stragglers: dict[int, Straggler] = {}  # rank -> the report that named it
        self._straggling: dict[int, int] = {}
        self._scored_at = time.monotonic()
        self._checked_at = float("-inf")

    def check(self, channel, status) -> tuple[list[Straggler], MetricRows]:
        """The ranks newly found straggling, and the scores due for recording: a rank straggles once
        its mean compute time was above the factor times the others' median for `steps` checks in
        a row."""
        now = time.monotonic()
        if status.known > SCORED_AT_EVERY_CHECK and now - self._checked_at < min(
            SCORE_EVERY_MAX_S, status.known / RANKS_SCORED_PER_S
        ):
            return [], []
        self._checked_at = now
        window = max(4 * self.steps, 20)
        recent = channel.compute_means(window)  # rank -> (node, mean, step)
        if len(recent) < 2:
            return [], []
        ordered = sorted(mean for _, mean, _ in recent.values())
        scores, found = {}, []
        for rank, (node, mean, step) in recent.items():
            others = _median_without(ordered, bisect.bisect_left(ordered, mean))
            if others <= 0:
                continue
            scores[rank] = mean / others
            above = scores[rank] > self.factor
            self._straggling[rank] = self._straggling.get(rank, 0) + 1 if above else 0
            if rank not in self.stragglers and self._straggling[rank] >= self.steps:
                report = Straggler(rank, node, round(scores[rank], 2), step, time.time())
                self.stragglers[rank] = report
                found.append(report)
        rows: MetricRows = []
        if now - self._scored_at > STRAGGLER_REPORT_S:
            step, t = status.max_step, time.time()
            rows = [(f"straggler_score_rank_{r}", s, step, t) for r, s in scores.items()]
            self._scored_at = now
        return found, rows


def _median_without(ordered: list[float], index: int) -> float:
    """The median of `ordered` (sorted) without its element at `index`."""
    n = len(ordered) - 1

    def at(i: int) -> float:
        return ordered[i if i < index else i + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2
