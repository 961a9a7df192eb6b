"""The Launcher protocol and the plain records passed between lifecycle tasks."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the spec imports this package (its backends' configs)
    from trainflow.runspec import RunSpec


@dataclass
class Allocation:
    """What provision reserved for one lifecycle run; release gives all of it back. Each backend
    keeps its own state in a subclass of this, in its own package."""

    run_id: str
    backend: str
    nodes: int
    scratch: Path
    ports: dict[str, int] = field(default_factory=dict)
    status_host: str = "127.0.0.1"  # where workers reach the orchestrator's status channel
    slots: list[int] = field(default_factory=list)  # healthy node slots; attempt node i runs in slots[i]
    left_out: list[int] = field(default_factory=list)  # slots a shrink took out of slots: the job grows back into them

    def network_record(self) -> dict | None:
        """The node network a reaper must remove if the orchestrator dies before teardown (None: none)."""
        return None


@dataclass(frozen=True)
class AttemptPlan:
    attempt: int
    status_address: str
    status_token: str
    code_version: str
    restore_prefix: str | None
    pause_at_steps: tuple[int, ...] = ()  # drills: every rank waits at each until its fault is in
    # recoveries in place each outcome has left in its budget (failures.in_place_budget)
    in_place_budget: dict[str, int] = field(default_factory=dict)


@dataclass
class AttemptHandle:
    attempt: int
    nodes: int
    started_at: float
    logs: dict[int, Path]
    procs_per_node: int = 1
    processes: dict[int, Any] = field(default_factory=dict)
    slots: list[int] = field(default_factory=list)  # the node slot each node of this attempt runs in
    workers: dict[int, list] = field(default_factory=dict)  # backend's view of each node's worker processes
    rank_records: dict[int, Path] = field(
        default_factory=dict
    )  # where each node's agent records its ranks (rank_records)
    pause_at_steps: tuple[int, ...] = ()  # drills: every rank waits at each until its fault is in
    in_place_budget: dict[str, int] = field(default_factory=dict)  # the plan's (AttemptPlan.in_place_budget)
    warm_nodes: int = 0  # nodes whose agent and ranks a standby interpreter forked (warm workers)


@dataclass(frozen=True)
class RankExit:
    """One failed rank as its node's launcher saw it."""

    rank: int
    local_rank: int
    exitcode: int  # negative: killed by that signal
    observed_at: float | None = None  # when the launcher noticed (torchrun: to the second)
    root_cause: bool = False  # the launcher's first observed failure on that node
    stderr_tail: tuple[str, ...] = ()  # the rank's last stderr lines
    error_line: str = ""  # the exception line of the rank's torchrun error file (a script using @record)


@dataclass(frozen=True)
class NodeExit:
    node: int
    returncode: int | None  # None while running; negative: killed by that signal
    workers_lost: bool = field(default=False, kw_only=True)  # a worker died; its agent still runs
    # every worker exited 0; its agent still runs (at torchrun's exit barrier, waiting for the other nodes)
    workers_finished: bool = field(default=False, kw_only=True)
    worker_returncode: int | None = field(default=None, kw_only=True)  # the failed worker's own code
    ranks: tuple[RankExit, ...] = field(default=(), kw_only=True)  # per failed rank, where the backend knows
    log_tail: tuple[str, ...] = field(default=(), kw_only=True)  # a failed node's own last log lines

    @property
    def running(self) -> bool:
        return self.returncode is None

    @property
    def done(self) -> bool:
        """Its workers are through with the job: the node exited 0, or waits for the others to."""
        return self.returncode == 0 or (self.running and self.workers_finished)

    @property
    def failing(self) -> bool:
        return self.workers_lost or (self.returncode is not None and self.returncode != 0)


@dataclass
class ReleaseReport:
    stopped_processes: int = 0
    released_standbys: int = 0  # warm workers' standby interpreters (one per node slot) ended
    released_ports: list[int] = field(default_factory=list)
    removed_paths: list[str] = field(default_factory=list)
    survivors: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.survivors

    def remove_folder(self, path: Path) -> None:
        """Delete a folder the allocation owned; one that stays is a survivor."""
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            self.removed_paths.append(str(path))
        if path.exists():
            self.survivors.append(f"{path} could not be removed")

    def as_dict(self) -> dict:
        return {
            "stopped_processes": self.stopped_processes,
            "released_standbys": self.released_standbys,
            "released_ports": self.released_ports,
            "removed_paths": self.removed_paths,
            "survivors": self.survivors,
            "clean": self.clean,
        }


class Launcher(Protocol):
    name: str

    def provision(self, spec: RunSpec, run_id: str, scratch: Path) -> Allocation: ...

    def launch(self, spec: RunSpec, allocation: Allocation, plan: AttemptPlan) -> AttemptHandle: ...

    def poll(self, handle: AttemptHandle) -> list[NodeExit]: ...

    def stop(self, handle: AttemptHandle, grace_s: float) -> int: ...

    def release(self, allocation: Allocation) -> ReleaseReport: ...

    # Optional abilities are the protocols in trainflow.backends.abilities.
