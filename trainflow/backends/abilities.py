"""What a backend may do beyond the Launcher protocol; callers test for an ability, never for a name."""

from __future__ import annotations

import signal
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable

from trainflow.backends.base import Allocation, AttemptHandle
from trainflow.runspec import RunSpec


class RenderError(ValueError):
    """The backend cannot render this spec (for example, its image cannot be resolved)."""


@runtime_checkable
class ChecksSpec(Protocol):
    """Has checks of its own before anything is provisioned; raises SpecError naming the field."""

    def preflight(self, spec: RunSpec) -> None: ...


@runtime_checkable
class BuildsImage(Protocol):
    """Runs a container image, which must exist (or be built) before the first launch."""

    def prepare_image(self, spec: RunSpec, allocation: Allocation) -> dict: ...


@runtime_checkable
class StartsAhead(Protocol):
    """Can start something the run will need (standby interpreters, marked with the run's id)
    before the flow does; the context ends what the provisioning did not take."""

    def head_start(self, spec: RunSpec, run_id: str) -> AbstractContextManager[None]: ...


@runtime_checkable
class ReplacesNodes(Protocol):
    """Can bring a lost node's slot back (a new pod, a new Slurm node) for the next attempt."""

    def replace_node(self, allocation: Allocation, slot: int) -> bool: ...


@runtime_checkable
class ProbesNodes(Protocol):
    """Can say whether a silent node is still reachable: 'reachable', 'unreachable' or 'unknown'."""

    def probe(self, handle: AttemptHandle, node: int) -> str: ...


@runtime_checkable
class DescribesNodes(Protocol):
    """Can say what each node of an attempt is doing as the backend sees it (a pod waiting for its
    image, say): evidence when no worker reports in time."""

    def describe(self, handle: AttemptHandle) -> dict: ...


@runtime_checkable
class DumpsStacks(Protocol):
    """Can read the Python stacks of a hung attempt's ranks."""

    def dump_stacks(self, handle: AttemptHandle, pids_by_rank: dict[int, int]) -> dict[int, str]: ...


@runtime_checkable
class KnowsRankProcesses(Protocol):
    """Can name each running rank's process without the rank's own report (plain scripts)."""

    def rank_processes(self, handle: AttemptHandle, nodes: list[int]) -> dict[int, int]: ...


@runtime_checkable
class BindsStatusElsewhere(Protocol):
    """Workers reach the status channel from outside this host, so it binds to this address."""

    status_bind_host: str


@runtime_checkable
class RendersManifests(Protocol):
    """Can write an attempt's objects as files for review (`trainflow render`)."""

    def render(self, spec: RunSpec, out_dir: Path, run_id: str | None, attempt: int) -> list[Path]: ...


@runtime_checkable
class SharesScratch(Protocol):
    """The orchestrator reaches every node's scratch folder, so drills can hold the ranks at a fault's step."""

    shares_scratch: bool


@runtime_checkable
class SignalsRanks(Protocol):
    """Can send a signal to one rank's process, by the pid it reported (drills: crash, kill, hang,
    straggler, corrupt-checkpoint); raises RuntimeError where this allocation's ranks are out of reach."""

    def signal_rank(self, allocation: Allocation, pid: int, sig: signal.Signals) -> None: ...


@runtime_checkable
class EndsRanks(Protocol):
    """Can kill one rank's process, noted first for its node's agent (backends/rank_replacement.py)
    with `reason`: with `hang`, a frozen rank, which the agent replaces in place, its death the
    hang; without, one the agent must not replace (the attempt ends). False where the process was
    gone already."""

    def end_rank(self, handle: AttemptHandle, node: int, pid: int, reason: str, hang: bool) -> bool: ...


@runtime_checkable
class KnowsReplacedRanks(Protocol):
    """Knows the pids of a node's rank processes that died and had another started in their place."""

    def replaced_pids(self, handle: AttemptHandle, node: int) -> set[int]: ...


@runtime_checkable
class PreemptsNodes(Protocol):
    """Can give one node of an attempt the SIGTERM a scheduler or cloud sends before taking it away."""

    def preempt_node(self, handle: AttemptHandle, node: int) -> None: ...


@runtime_checkable
class CutsNodes(Protocol):
    """Can take one node slot off the network, its processes still running, as a lost host
    (`permanent`: it never comes back; with `replaced_later`, a replacement is there from the second
    time `ReplacesNodes.replace_node` asks for the slot, once the job has gone on without it); returns
    what was cut, for the drill's record. Raises RuntimeError where this allocation's node links cannot
    be cut."""

    def cut_node(self, allocation: Allocation, slot: int, permanent: bool, replaced_later: bool = False) -> str: ...
