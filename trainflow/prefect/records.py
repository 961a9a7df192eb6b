"""The records the lifecycle's tasks hand each other: each stage's result is what the next stage
uses, so the flow's task graph in Prefect is the lifecycle itself. Live parts (processes, sockets,
clients) are not in them: a provisioned run carries its flow's LiveRun (trainflow.orchestrator.live),
which holds them."""

from __future__ import annotations

from dataclasses import dataclass

from trainflow.backends import Allocation, AttemptHandle, Launcher
from trainflow.checkpoint.storage import Storage
from trainflow.orchestrator.live import LiveRun
from trainflow.orchestrator.status import StatusServer
from trainflow.reporting.tracking import Tracker
from trainflow.repro.environment import Environment
from trainflow.runspec import RunSpec


class HandOff:
    """A record one stage hands the next. Deliberately not a dataclass: Prefect links a task to the
    tasks that made its inputs by walking into dataclasses, models and collections, so a record
    holding what came before would link each task to every stage before it. A hand-off is taken
    whole, and the graph's edges are the hand-offs."""

    __slots__: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


class RunRecord(HandOff):
    """Identity of one lifecycle run: its validated spec, trainflow's run id and where MLflow keeps it."""

    __slots__ = ("spec", "run_id", "mlflow_run_id", "tracking_uri", "experiment", "prefect_flow_run_id", "started_at")

    def __init__(
        self,
        *,
        spec: RunSpec,
        run_id: str,
        mlflow_run_id: str,
        tracking_uri: str,
        experiment: str,
        prefect_flow_run_id: str,
        started_at: float,
    ):
        self.spec, self.run_id, self.mlflow_run_id = spec, run_id, mlflow_run_id
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.prefect_flow_run_id, self.started_at = prefect_flow_run_id, started_at


class Provisioned(HandOff):
    """What provision reserved for the run, and the run's live parts; teardown releases all of it."""

    __slots__ = ("record", "allocation", "live")

    def __init__(self, record: RunRecord, allocation: Allocation, live: LiveRun):
        self.record, self.allocation, self.live = record, allocation, live

    @property
    def launcher(self) -> Launcher:
        return self.live.launcher

    @property
    def channel(self) -> StatusServer:
        return self.live.channel

    @property
    def tracker(self) -> Tracker:
        return self.live.tracker

    @property
    def storage(self) -> Storage:
        """The run's checkpoint store."""
        return self.live.storage


class Ready(HandOff):
    """A provisioned job whose environment satisfies the lock: what every attempt launches on."""

    __slots__ = ("provisioned", "environment")

    def __init__(self, provisioned: Provisioned, environment: Environment):
        self.provisioned, self.environment = provisioned, environment


class Launched(HandOff):
    """One running attempt: what the tasks that follow it (watch, snapshot, release, recover) use;
    `attempt_run_id`: its nested MLflow run, open from the attempt's start to its end."""

    __slots__ = ("ready", "spec", "handle", "resumed_from_step", "attempt_run_id")

    def __init__(
        self, ready: Ready, spec: RunSpec, handle: AttemptHandle, resumed_from_step: int, attempt_run_id: str | None
    ):
        self.ready, self.spec, self.handle, self.resumed_from_step = ready, spec, handle, resumed_from_step
        self.attempt_run_id = attempt_run_id

    @property
    def provisioned(self) -> Provisioned:
        return self.ready.provisioned

    @property
    def record(self) -> RunRecord:
        return self.ready.provisioned.record

    @property
    def attempt(self) -> int:
        return self.handle.attempt


@dataclass(frozen=True)
class CheckpointRecord:
    step: int
    uri: str
    verified: bool
    bytes: int
    attempt: int
    reason: str = ""
