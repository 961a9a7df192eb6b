"""What a platform team reads off a run: where time went, what failures cost, and what to fix.

Every figure is the run ledger's (trainflow/contracts/ledger.py), printed as the ledger prints it;
each finding names its figure and what usually helps.
"""

from __future__ import annotations

from trainflow.contracts import RunFigures
from trainflow.contracts.evidence import Straggler
from trainflow.contracts.ledger import percent, seconds

COMM_SHARE_LIMIT = 0.30
DATA_SHARE_LIMIT = 0.10
CHECKPOINT_SHARE_LIMIT = 0.05


def diagnose(figures: RunFigures, stragglers: list[Straggler]) -> list[str]:
    findings = []
    if figures.comm_share > COMM_SHARE_LIMIT:
        findings.append(
            f"communication is {percent(figures.comm_share)} of step time (> {percent(COMM_SHARE_LIMIT)}): larger "
            "batches per rank, gradient accumulation, bucket tuning or a faster interconnect usually help"
        )
    if figures.data_share > DATA_SHARE_LIMIT:
        findings.append(
            f"waiting for data is {percent(figures.data_share)} of step time (> {percent(DATA_SHARE_LIMIT)}): more "
            "loader workers, prefetching, pinned memory or data closer to the nodes usually help"
        )
    if figures.checkpoint_share > CHECKPOINT_SHARE_LIMIT:
        findings.append(
            f"checkpoints stall training for {seconds(figures.checkpoint_stall_total_s)}, "
            f"{percent(figures.checkpoint_share)} of step time (> {percent(CHECKPOINT_SHARE_LIMIT)}): save less "
            "often or asynchronously"
        )
    for straggler in stragglers:
        findings.append(
            f"rank {straggler.rank} on node {straggler.node} is a persistent straggler (compute "
            f"{straggler.score}x the others'): check that node's load, thermals or data shard"
        )
    return findings
