"""When a checkpoint also goes to the durable store (a snapshot), and not only to the local tier."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class SnapshotPolicy:
    """Rank 0 asks for a snapshot; a checkpoint is snapshotted when any rank asks (every rank learns
    the answer in the same collective, so all of them upload or none)."""

    snapshot_every_s: float = 0.0  # 0: every checkpoint is a snapshot
    keep_every_steps: int = 0  # steps retention keeps forever are always snapshotted (0: none)
    local_tier: bool = True  # without a local tier every checkpoint is a snapshot
    last_snapshot_at: float | None = None  # monotonic time the last snapshot started

    def wants_snapshot(self, step: int, commit: bool, now: float | None = None) -> bool:
        """`commit`: the caller waits for a durable commit (the last step, an emergency checkpoint)."""
        now = time.monotonic() if now is None else now
        if commit or not self.local_tier or self.snapshot_every_s <= 0:
            return True
        if self.last_snapshot_at is None:  # the first checkpoint of an attempt: a durable baseline soon
            return True
        if self.keep_every_steps and step % self.keep_every_steps == 0:
            return True
        return now - self.last_snapshot_at >= self.snapshot_every_s

    def started(self, now: float | None = None) -> None:
        self.last_snapshot_at = time.monotonic() if now is None else now
