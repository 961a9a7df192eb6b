"""What the local backend holds for one run: its agents' sessions and, optionally, a network per node."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainflow.backends.base import Allocation
from trainflow.backends.netns import LostSlots, NodeNetwork


@dataclass
class LocalAllocation(Allocation):
    network: NodeNetwork | None = None  # one network namespace per node (resources.network: namespaces)
    sessions: list[int] = field(default_factory=list)  # every attempt's agent sessions, ended at release
    lost: LostSlots = field(default_factory=LostSlots)  # node slots a drill took away for good
    warm_pools: dict[int, Any] = field(default_factory=dict)  # node slot -> its zygote (warm_pools.WarmPool)
    temp_dir: Path | None = None  # the run's TMPDIR on this machine (job_tmp.py)

    def network_record(self) -> dict | None:
        return self.network.record() if self.network is not None else None
