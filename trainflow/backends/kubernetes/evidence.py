"""What a failed pod's log says about its ranks, read once from the cluster when the pod has ended.

A pod's ranks write into the pod's own log (the container's output) through trainflow's node agent,
which ends it with torchrun's failure report: every failed rank with its exit code, the root cause
first (torchrun_report.py reads it as on the other backends). Where the pod ran one rank, the lines
before that report are that rank's last words, the exception line among them; with several ranks
their lines are mixed in one log, so the report alone speaks for each rank and the log's tail stays
the node's evidence.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trainflow.backends.torchrun_report import failed_ranks, log_tail, output_before_report, root_cause_exitcode


def pod_evidence(node_log: Path, ranks_per_pod: int) -> dict:
    """The fields of a failed node's exit that its kept log (`node_log`) gives."""
    ranks = failed_ranks(node_log)
    if ranks_per_pod == 1:
        last_words = tuple(output_before_report(node_log))
        ranks = [replace(rank, stderr_tail=last_words) for rank in ranks]
    return {
        "ranks": tuple(ranks),
        "worker_returncode": root_cause_exitcode(node_log),
        "log_tail": () if ranks else tuple(log_tail(node_log)),
    }
