"""What a platform team reads off a run: where time went, what failures cost, and what to fix.

Figures come from the attempts' totals (sums of per-step times reported by rank 0) and wall
clocks; each finding names its figure and what usually helps.
"""

from __future__ import annotations

from trainflow.failures import AttemptResult

COMM_SHARE_LIMIT = 0.30
DATA_SHARE_LIMIT = 0.10
CHECKPOINT_SHARE_LIMIT = 0.05


def cost_figures(results: list[AttemptResult], world_size: int, lost_steps: int) -> dict[str, float]:
    """Device-hours, what was wasted, and where step time went."""
    steps = sum(r.totals.get("steps", 0) for r in results)
    step_time = sum(r.totals.get("step_time_s", 0.0) for r in results)
    comm = sum(r.totals.get("comm_wait_s", 0.0) for r in results)
    data = sum(r.totals.get("data_wait_s", 0.0) for r in results)
    stall = sum(r.totals.get("checkpoint_stall_s", 0.0) for r in results)
    wall = (results[-1].ended_at - results[0].started_at) if results else 0.0
    mean_step = step_time / steps if steps else 0.0
    recovery = sum(
        max(0.0, (later.first_step_at or later.started_at) - earlier.detected_at)
        for earlier, later in zip(results, results[1:])
    )
    wasted_s = lost_steps * mean_step + recovery + stall
    return {
        "wall_s": round(wall, 3),
        "device_hours": round(world_size * wall / 3600, 6),
        "wasted_device_hours": round(world_size * wasted_s / 3600, 6),
        "recovery_s_total": round(recovery, 3),
        "lost_work_s": round(lost_steps * mean_step, 3),
        "checkpoint_stall_total_s": round(stall, 3),
        "mean_step_time_s": round(mean_step, 6),
        "comm_share": round(comm / step_time, 4) if step_time else 0.0,
        "data_share": round(data / step_time, 4) if step_time else 0.0,
        "checkpoint_share": round(stall / step_time, 4) if step_time else 0.0,
    }


def diagnose(figures: dict[str, float], stragglers: list[dict]) -> list[str]:
    findings = []
    if figures["comm_share"] > COMM_SHARE_LIMIT:
        findings.append(
            f"communication is {figures['comm_share']:.0%} of step time (> {COMM_SHARE_LIMIT:.0%}): larger batches "
            "per rank, gradient accumulation, bucket tuning or a faster interconnect usually help"
        )
    if figures["data_share"] > DATA_SHARE_LIMIT:
        findings.append(
            f"waiting for data is {figures['data_share']:.0%} of step time (> {DATA_SHARE_LIMIT:.0%}): more loader "
            "workers, prefetching, pinned memory or data closer to the nodes usually help"
        )
    if figures["checkpoint_share"] > CHECKPOINT_SHARE_LIMIT:
        findings.append(
            f"checkpoints stall training for {figures['checkpoint_share']:.0%} of step time "
            f"(> {CHECKPOINT_SHARE_LIMIT:.0%}): save less often or asynchronously"
        )
    for straggler in stragglers:
        findings.append(
            f"rank {straggler['rank']} on node {straggler['node']} is a persistent straggler (compute "
            f"{straggler['score']}x the others'): check that node's load, thermals or data shard"
        )
    return findings
