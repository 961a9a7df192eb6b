"""The status channel holds a job of a thousand ranks: synthetic ranks through the real node relay
code, one stream per node from loopback addresses of their own, against the real StatusServer and
AttemptWatcher in a process of their own. Correctness only (the figures are `make bench`'s)."""

from __future__ import annotations

from trainflow.drills.bench.scale import Options, run_benchmark


def test_a_thousand_ranks_are_all_heard_none_dropped_and_a_silent_node_is_found():
    figures = run_benchmark(Options(ranks=1024, steps_per_s=2, seconds=3, heartbeat_timeout_s=10))
    assert (figures["ranks"], figures["nodes"]) == (1024, 128)
    assert figures["dropped"] == 0 and figures["gave_up"] == 0
    assert figures["false_verdicts"] == 0, figures["verdict"]  # the silent node, NODE_LOST, and nothing else
    assert figures["silent_node_detect_s"] is not None  # the silent node itself was found, after the silence
    assert figures["steps_incomplete"] == 0  # every step before the silence complete, over all 1,024 ranks
    assert figures["threads"] <= 4  # one event loop, whatever the job's size
