"""The checkpoint benchmark's figures as a small table, then its targets."""

from __future__ import annotations

MB = 1 << 20


def render(figures: dict) -> str:
    """The figures as a small table, then the targets."""
    rows = [
        ("checkpoint", f"{figures['checkpoint_bytes'] / MB:.1f} MiB in {figures['checkpoint_files']} files"),
        (
            "S3 endpoint",
            f"{figures['endpoint']} (parts {figures['s3_upload_part_mb']} MiB up, "
            f"{figures['s3_download_part_mb']} MiB down, {figures['s3_concurrency']} in flight)",
        ),
        ("sync stall", f"{figures['sync_stall_s']:.3f} s"),
        ("async stall", f"{figures['async_stall_s']:.3f} s"),
        ("local write", f"{figures['local_write_MBps']:.0f} MiB/s"),
        (
            "S3 upload",
            f"{figures['s3_upload_MBps']:.0f} MiB/s (raw boto3 {figures['raw_boto3_upload_MBps']:.0f}; "
            f"in the background, below training's priority: {figures['s3_upload_background_MBps']:.0f})",
        ),
        ("S3 restore", f"{figures['s3_restore_MBps']:.0f} MiB/s (raw boto3 {figures['raw_boto3_download_MBps']:.0f})"),
        ("verify", f"{figures['verify_s']:.3f} s (whole restore {figures['restore_s']:.2f} s)"),
        (
            "step overhead",
            f"{figures['step_overhead_pct']:.1f} % (checkpoint every {figures['checkpoint_every_steps']} "
            f"steps of {figures['step_time_s'] * 1000:.0f} ms, snapshot at most every "
            f"{figures['snapshot_every_s']:g} s; an interval ending in a local checkpoint "
            f"{figures['step_overhead_local_pct']:.1f} %, in a snapshot "
            f"{figures['step_overhead_snapshot_pct']:.1f} %)",
        ),
    ]
    lines = [f"  {name:<14} {value}" for name, value in rows]
    lines.append("targets:")
    for name, target in figures["targets"].items():
        mark = "met" if target["met"] else "NOT MET"
        lines.append(f"  {name:<14} {target['measure']} = {target['value']} (target {target['target']}): {mark}")
    return "\n".join(lines)
