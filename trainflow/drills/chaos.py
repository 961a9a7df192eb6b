"""Fault injection from outside the workload, for drills: signals, frozen processes, a cut network
link, an unreachable storage endpoint, a damaged checkpoint. The training code never cooperates,
except that (where the backend shares the run's scratch folder) every rank stands still after the
fault's step until the fault is in: the fault lands at the step asked for however fast the steps
are, instead of wherever a task racing the training happens to catch it.

An exception is the one fault the rank's runtime takes part in: in a drill's attempt it raises a
DistNetworkError when the drill's signal reaches it, as a transient network error would surface in
a training loop.

Each kind of fault goes in through an ability its backend offers (trainflow.backends.abilities); a
drill whose backend cannot inject its fault is refused before anything runs (`backend_inability`)."""

from __future__ import annotations

import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trainflow.backends import Allocation, AttemptHandle, Launcher
from trainflow.backends.abilities import CutsNodes, EndsRanks, KnowsRankProcesses, PreemptsNodes, SignalsRanks
from trainflow.checkpoint.catalog import list_committed
from trainflow.checkpoint.storage import Storage, StorageError, open_storage
from trainflow.drills.storage_proxy import relay_on
from trainflow.drills.throttle import throttle_in_own_process
from trainflow.orchestrator.status import StatusServer
from trainflow.worker_config import (
    EXCEPTION_SIGNAL,
    fault_gate_path,
    gate_arrival_path,
    gate_signal_path,
    step_gate,
)


class FaultKind(str, Enum):
    exception = "exception"  # a transient error raised in a rank's training loop (DistNetworkError)
    crash = "crash"
    kill = "kill"
    hang = "hang"
    straggler = "straggler"
    preempt = "preempt"
    node_loss = "node-loss"
    storage_outage = "storage-outage"
    corrupt_checkpoint = "corrupt-checkpoint"


class FaultPlan(BaseModel):
    """One fault to inject into the first attempt of a run."""

    model_config = ConfigDict(extra="forbid")

    kind: FaultKind = Field(title="Fault", description="What to break.")
    attempt: int = Field(default=1, ge=1, title="Attempt", description="Which attempt of the run to break.")
    at_step: int = Field(default=30, gt=0, title="At step", description="Inject once every rank has reached this step.")
    at_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        title="At (s)",
        description="Plain scripts: inject this many seconds after the attempt's launch "
        "(they report no steps, so there is no step to wait at).",
    )
    rank: int | None = Field(default=None, ge=0, title="Rank", description="Target rank (process faults).")
    node: int | None = Field(default=None, ge=0, title="Node", description="Target node (preempt, node-loss).")
    duration_s: float = Field(default=8.0, gt=0, le=600, title="Duration (s)", description="Straggler / outage length.")
    permanent: bool = Field(default=False, title="Permanent", description="node-loss: the node never comes back.")
    replaced_later: bool = Field(
        default=False,
        title="Replaced later",
        description="node-loss with permanent: a replacement for the lost node becomes available once the "
        "job has gone on without it (the first ask for the node fails, later ones succeed): the shrunken job "
        "grows back at its next checkpoint.",
    )
    stall: bool = Field(
        default=False,
        title="Stall",
        description="storage-outage: requests wait unanswered for "
        "the duration (an endpoint that stops answering) instead of being refused.",
    )
    proxy_port: int | None = Field(default=None, title="Storage proxy port", description="Set by the drill.")

    @property
    def moment(self) -> str:
        """When the fault goes in, for names: `at-step-30` or `at-25s`."""
        return f"at-{self.at_s:g}s" if self.at_s is not None else f"at-step-{self.at_step}"

    def target_rank(self, world_size: int) -> int:
        return self.rank if self.rank is not None else world_size - 1

    def target_node(self, nodes: int) -> int:
        return self.node if self.node is not None else nodes - 1


# what the backend must be able to do for each kind (None: the drill breaks it outside the backend)
FAULT_ABILITIES: dict[FaultKind, type | None] = {
    FaultKind.exception: SignalsRanks,  # the drill's signal, which the rank's runtime raises on
    FaultKind.crash: SignalsRanks,
    FaultKind.kill: SignalsRanks,
    FaultKind.hang: SignalsRanks,
    FaultKind.straggler: SignalsRanks,
    FaultKind.corrupt_checkpoint: SignalsRanks,  # a rank is killed so the next attempt must restore
    FaultKind.preempt: PreemptsNodes,
    FaultKind.node_loss: CutsNodes,
    FaultKind.storage_outage: None,  # the drill's own relay in front of the storage endpoint
}
ABILITY_WORDS = {
    SignalsRanks: "signal a rank's process",
    PreemptsNodes: "preempt a node",
    CutsNodes: "cut a node off the network",
}


def backend_inability(kind: FaultKind, launcher: Launcher) -> str | None:
    """Why this backend cannot inject `kind`, for a one-line error; None when it can."""
    ability = FAULT_ABILITIES[kind]
    if ability is None or isinstance(launcher, ability):
        return None
    return f"the {launcher.name} backend cannot {ABILITY_WORDS[ability]} (it does not implement {ability.__name__})"


@dataclass
class Injection:
    kind: str
    injected: bool = False
    injected_at: float | None = None
    target: str = ""
    detail: dict = field(default_factory=dict)


def attempt_ended(handle: AttemptHandle) -> bool:
    return any(proc.poll() is not None for proc in handle.processes.values())


def wait_while_running(handle: AttemptHandle, condition: Callable[[], bool], timeout_s: float) -> bool:
    """True once `condition()` holds; False if the attempt ended or time ran out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        if attempt_ended(handle):
            return False
        time.sleep(0.02)
    return False


def wait_for_step(channel: StatusServer, handle: AttemptHandle, world_size: int, step: int, timeout_s: float) -> bool:
    """True once every rank reported `step`; False if the attempt ended or time ran out first."""

    def reached() -> bool:
        status = channel.snapshot()
        return len(status.ranks) == world_size and status.min_step() >= step

    return wait_while_running(handle, reached, timeout_s)


def wait_at_gate(gate: Path, handle: AttemptHandle, world_size: int, timeout_s: float) -> bool:
    """True once every rank stands at the fault gate (see `trainflow.runtime.fault_gate.wait_for_fault`); False if
    the attempt ended or time ran out first."""
    arrivals = [gate_arrival_path(gate, rank) for rank in range(world_size)]
    return wait_while_running(handle, lambda: all(path.exists() for path in arrivals), timeout_s)


def wait_for_signal(gate: Path, handle: AttemptHandle, world_size: int, timeout_s: float) -> bool:
    """True once a rank at the fault gate saw its SIGTERM (see `trainflow.runtime.fault_gate.wait_for_fault`);
    False if the attempt ended or time ran out first."""
    marks = [gate_signal_path(gate, rank) for rank in range(world_size)]
    return wait_while_running(handle, lambda: any(path.exists() for path in marks), timeout_s)


def worker_pid(channel: StatusServer, rank: int) -> int:
    status = channel.snapshot()
    pid = status.ranks[rank].pid if rank in status.ranks else None
    if not pid:
        raise RuntimeError(f"rank {rank} never reported its pid")
    return pid


def inject(
    plan: FaultPlan,
    launcher: Launcher,
    handle: AttemptHandle,
    channel: StatusServer,
    allocation: Allocation,
    checkpoint_uri: str,
    world_size: int,
    timeout_s: float = 600,
) -> Injection:
    """Wait for the step, then break what the plan says through the backend's ability, then let
    the waiting ranks go on. Returns what was done and when."""
    inability = backend_inability(plan.kind, launcher)
    if inability:
        raise RuntimeError(f"{plan.kind.value}: {inability}")
    try:
        return _inject(plan, launcher, handle, channel, allocation, checkpoint_uri, world_size, timeout_s)
    finally:
        open_gate(allocation, handle, plan.at_step)


def open_gate(allocation: Allocation, handle: AttemptHandle, step: int) -> None:
    """Let the ranks waiting at the fault's step go on (see `trainflow.runtime.fault_gate.wait_for_fault`)."""
    gate = step_gate(fault_gate_path(allocation.scratch, handle.attempt), step)
    if gate.parent.exists():
        gate.touch()


def _inject(
    plan: FaultPlan,
    launcher: Launcher,
    handle: AttemptHandle,
    channel: StatusServer,
    allocation: Allocation,
    checkpoint_uri: str,
    world_size: int,
    timeout_s: float,
) -> Injection:
    if plan.at_s is not None:
        return _inject_at_time(plan, launcher, handle, allocation, checkpoint_uri, world_size, timeout_s)
    record = Injection(kind=plan.kind.value)
    deadline = time.monotonic() + timeout_s
    if not wait_for_step(channel, handle, world_size, plan.at_step, timeout_s):
        record.detail["skipped"] = f"the attempt ended before step {plan.at_step}"
        return record
    # a rank reports a checkpoint step before that step's save waits for the previous save; at the
    # gate it has waited, so the fault never lands while the save before the step's own is unfinished
    at_gate = False
    gate = step_gate(fault_gate_path(allocation.scratch, handle.attempt), plan.at_step)
    if plan.at_step in handle.pause_at_steps:
        at_gate = wait_at_gate(gate, handle, world_size, max(0.0, deadline - time.monotonic()))
        if not at_gate and attempt_ended(handle):
            record.detail["skipped"] = f"the attempt ended before every rank stood at step {plan.at_step}"
            return record
    kind = plan.kind
    status = channel.snapshot()
    record.detail["step"] = status.max_step()  # where the fastest rank is: the fault's step when gated
    record.detail["steps"] = {rank: r.step for rank, r in sorted(status.ranks.items())}
    record.detail["at_gate"] = at_gate  # every rank had returned from its step's checkpoint call
    if kind in (FaultKind.exception, FaultKind.crash, FaultKind.kill, FaultKind.hang, FaultKind.straggler):
        rank = plan.target_rank(world_size)
        pid = worker_pid(channel, rank)
        record.target = f"rank {rank} (pid {pid})"
        if kind == FaultKind.straggler:
            record.injected_at = time.time()
            record.injected = True
            open_gate(allocation, handle, plan.at_step)  # the slowing down is the fault: training goes on under it
            launcher.signal_rank(allocation, pid, signal.SIGCONT)  # a process of this machine, or this fails
            record.detail["frozen_times"] = throttle_in_own_process(pid, plan.duration_s, lambda: attempt_ended(handle))
            return record
        sig = {
            FaultKind.exception: EXCEPTION_SIGNAL,
            FaultKind.crash: signal.SIGSEGV,
            FaultKind.kill: signal.SIGKILL,
            FaultKind.hang: signal.SIGSTOP,
        }[kind]
        record.injected_at = time.time()
        launcher.signal_rank(allocation, pid, sig)
    elif kind == FaultKind.preempt:
        node = plan.target_node(handle.nodes)
        record.target = f"node {node}"
        record.injected_at = time.time()
        launcher.preempt_node(handle, node)  # the SIGTERM a cloud or the kubelet sends first
        if at_gate:
            # a scheduler delivers the signal in its own time (Slurm: controller, node daemon, step):
            # the ranks stay at the fault's step until it is there, or it would land steps later
            record.detail["signal_reached_ranks"] = wait_for_signal(
                gate, handle, world_size, max(0.0, deadline - time.monotonic())
            )
    elif kind == FaultKind.node_loss:
        node = plan.target_node(handle.nodes)
        record.injected_at = time.time()
        record.target = (
            f"node {node} ({launcher.cut_node(allocation, handle.slots[node], plan.permanent, plan.replaced_later)})"
        )
    elif kind == FaultKind.storage_outage:
        proxy = relay_on(plan.proxy_port)
        if proxy is None:
            raise RuntimeError("storage-outage needs the drill's storage proxy")
        record.target = f"storage endpoint behind 127.0.0.1:{plan.proxy_port}"
        record.injected_at = time.time()
        proxy.outage(plan.duration_s, stall=plan.stall)
    elif kind == FaultKind.corrupt_checkpoint:
        damaged = corrupt_latest_checkpoint(checkpoint_uri, allocation.run_id)
        record.detail["damaged"] = damaged
        rank = plan.target_rank(world_size)
        pid = worker_pid(channel, rank)
        record.target = f"{damaged}, then rank {rank} killed so the next attempt must restore"
        record.injected_at = time.time()
        kill_for_a_restore(launcher, allocation, handle, status.ranks[rank].node, pid)
    record.injected = True
    return record


def kill_for_a_restore(launcher: Launcher, allocation: Allocation, handle: AttemptHandle, node: int, pid: int) -> None:
    """SIGKILL a rank so that the next attempt restores from the checkpoint store; with in-process
    restart, noted for its agent first, which then does not replace it in place."""
    if handle.in_place_budget and isinstance(launcher, EndsRanks):
        launcher.end_rank(handle, node, pid, "the drill's corrupt-checkpoint fault: the next attempt restores", False)
    else:
        launcher.signal_rank(allocation, pid, signal.SIGKILL)


# what a fault at a time can break in a plain script, which reports nothing: its processes and copies
PLAIN_SIGNALS = {
    FaultKind.crash: signal.SIGSEGV,
    FaultKind.kill: signal.SIGKILL,
    FaultKind.corrupt_checkpoint: signal.SIGKILL,
}


def _inject_at_time(
    plan: FaultPlan,
    launcher: Launcher,
    handle: AttemptHandle,
    allocation: Allocation,
    checkpoint_uri: str,
    world_size: int,
    timeout_s: float,
) -> Injection:
    """A fault `plan.at_s` seconds after the attempt's launch: a plain script's ranks are found by
    the backend (they never report their pids), and a copy to damage must exist first."""
    record = Injection(kind=plan.kind.value)
    deadline = time.monotonic() + timeout_s
    due = handle.started_at + plan.at_s
    if not wait_while_running(handle, lambda: time.time() >= due, timeout_s):
        record.detail["skipped"] = f"the attempt ended before {plan.at_s:g}s"
        return record
    kind = plan.kind
    storage = open_storage(checkpoint_uri)
    if kind in PLAIN_SIGNALS:
        rank = plan.target_rank(world_size)
        pids: dict[int, int] = {}

        def started() -> bool:
            if isinstance(launcher, KnowsRankProcesses):
                pids.update(launcher.rank_processes(handle, list(handle.processes)))
            return rank in pids

        if not wait_while_running(handle, started, max(0.0, deadline - time.monotonic())):
            record.detail["skipped"] = f"rank {rank} was not running"
            return record
        record.target = f"rank {rank} (pid {pids[rank]})"
        if kind == FaultKind.corrupt_checkpoint:
            if not wait_while_running(
                handle, lambda: bool(list_committed(storage, allocation.run_id)), max(0.0, deadline - time.monotonic())
            ):
                record.detail["skipped"] = "no copy of the script's checkpoint was committed before the attempt ended"
                return record
            damaged = corrupt_latest_checkpoint(checkpoint_uri, allocation.run_id)
            record.detail["damaged"] = damaged
            record.target = f"{damaged}, then rank {rank} killed so the next attempt must restore"
        record.detail["newest_copy"] = _newest_copy(storage, allocation.run_id, record.detail.get("damaged"))
        record.detail["at_s"] = round(time.time() - handle.started_at, 3)
        record.injected_at = time.time()
        launcher.signal_rank(allocation, pids[rank], PLAIN_SIGNALS[kind])
    elif kind == FaultKind.preempt:
        node = plan.target_node(handle.nodes)
        record.target = f"node {node}"
        record.detail["newest_copy"] = _newest_copy(storage, allocation.run_id, None)
        record.detail["at_s"] = round(time.time() - handle.started_at, 3)
        record.injected_at = time.time()
        launcher.preempt_node(handle, node)
    elif kind == FaultKind.node_loss:
        # the node's relay falls silent with it: a plain script's node is lost by its heartbeats too
        node = plan.target_node(handle.nodes)
        record.detail["newest_copy"] = _newest_copy(storage, allocation.run_id, None)
        record.detail["at_s"] = round(time.time() - handle.started_at, 3)
        record.injected_at = time.time()
        record.target = (
            f"node {node} ({launcher.cut_node(allocation, handle.slots[node], plan.permanent, plan.replaced_later)})"
        )
    else:
        raise RuntimeError(f"{kind.value} cannot go in at a time")  # check_plan refuses it first
    record.injected = True
    return record


def _newest_copy(storage: Storage, run_id: str, damaged: str | None) -> str | None:
    """The newest copy committed as the fault goes in, not the one it damages: what the retry must
    restore (retention may remove it from the store before the run ends, so it is noted now)."""
    intact = [c for c in list_committed(storage, run_id) if not (damaged and damaged.startswith(f"{c.prefix}/"))]
    return f"{storage.uri}/{max(intact, key=lambda c: c.step).prefix}" if intact else None


def corrupt_latest_checkpoint(uri: str, run_id: str, tries: int = 3) -> str:
    """Flip bytes in the biggest file of the newest committed checkpoint; its size stays the same.
    A checkpoint that goes between its listing and its damage (retention, a newer commit's snapshot)
    is listed again."""
    storage = open_storage(uri)
    for _ in range(tries - 1):
        try:
            return _corrupt_newest(storage, uri, run_id)
        except StorageError:
            continue
    return _corrupt_newest(storage, uri, run_id)


def _corrupt_newest(storage: Storage, uri: str, run_id: str) -> str:
    committed = list_committed(storage, run_id)
    if not committed:
        raise RuntimeError(f"no committed checkpoint of {run_id} to damage under {uri}")
    newest = max(committed, key=lambda c: c.step)
    victim = max(newest.manifest.files, key=lambda f: f.size)
    key = f"{newest.prefix}/{victim.name}"
    data = bytearray(storage.read(key))
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    with tempfile.TemporaryDirectory(prefix="trainflow-corrupt-") as folder:
        damaged = Path(folder) / victim.name
        damaged.write_bytes(data)
        storage.upload(damaged, key)
    return key
