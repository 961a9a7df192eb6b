"""Plain records passed between lifecycle tasks."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from trainflow.backends import Allocation, Launcher
from trainflow.status import StatusServer
from trainflow.tracking import Tracker


@dataclass(frozen=True)
class RunRecord:
    """Identity of one lifecycle run: trainflow's run id and where MLflow keeps it."""

    run_id: str
    mlflow_run_id: str
    tracking_uri: str
    experiment: str
    prefect_flow_run_id: str
    started_at: float


@dataclass
class Provisioned:
    """Everything provision reserved; teardown releases all of it."""

    launcher: Launcher
    allocation: Allocation
    channel: StatusServer
    tracker: Tracker
    commits: queue.Queue = field(default_factory=queue.Queue)


@dataclass(frozen=True)
class CheckpointRecord:
    step: int
    uri: str
    verified: bool
    bytes: int
    attempt: int
    reason: str = ""

    def as_dict(self) -> dict:
        return {"step": self.step, "uri": self.uri, "verified": self.verified}
