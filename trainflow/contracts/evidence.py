"""What an attempt's verdict rests on, typed: the failed ranks, the rule that matched, the node that
went silent, the ranks blocked in storage calls, their stacks, the stragglers found on the way.

Each verdict fills the parts it has; `as_dict()` is the record kept with the attempt (MLflow's
`evidence.json`), one flat JSON object whose keys are these fields' names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class FailedRank:
    """One failure that could be the cause, as the evidence shows it (earliest first in a verdict)."""

    rank: int | None  # None: only the node is known (a backend without per-rank evidence)
    node: int
    exitcode: int | None  # negative: killed by that signal; None: died, code unknown
    at: float | None  # when it failed, where known
    error: str | None  # the type of the error the rank reported itself
    stderr_tail: tuple[str, ...] = ()
    error_file: str = ""  # the exception line of torchrun's error file for the rank

    def as_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["stderr_tail"] = list(self.stderr_tail)
        if not self.error_file:
            del record["error_file"]
        return record


@dataclass(frozen=True)
class MatchedRule:
    """The retry rule that matched the cause, and what of its evidence it matched."""

    rule: str  # "fault_tolerance.rules[0]" or "built-in rule 'out of memory'"
    means: str  # the rule as one line: "exit code 3 -> stop"
    matched: str  # "exit code 3", "SIGKILL", or the matching line
    rank: int | None
    node: int
    outcome: str | None  # the outcome the rule gives, or None
    action: str | None  # retry, stop or exclude_node, or None


@dataclass(frozen=True)
class SilentNode:
    """A node that fell silent without exiting: lost, or frozen while alive."""

    node: int
    rank: int | None  # the rank heard from longest ago; None: a node whose ranks report nothing
    node_state: str  # how the backend saw the node: running, gone, node-stopped, workers-stopped, unknown
    silent_s: float | None = None
    last_heartbeats: dict[int, float] = field(default_factory=dict)  # rank -> seconds since, the oldest first


@dataclass(frozen=True)
class StorageCall:
    """A rank blocked in a call to the checkpoint store when the verdict was reached."""

    rank: int
    node: int
    call: str
    since: float


@dataclass(frozen=True)
class Straggler:
    """A rank found straggling: its compute time `score` times the others' median."""

    rank: int
    node: int
    score: float
    step: int
    t: float

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "straggler", **asdict(self)}


@dataclass
class AttemptEvidence:
    exit_codes: dict[int, int | None] | None = None  # an attempt ended by exits: node -> its agent's code
    finished_ranks: list[int] | None = None  # and the ranks that had reported finished
    failed_ranks: list[FailedRank] = field(default_factory=list)
    rule: MatchedRule | None = None
    silent_node: SilentNode | None = None
    storage_calls: list[StorageCall] = field(default_factory=list)
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> its py-spy stack
    stragglers: list[Straggler] = field(default_factory=list)
    preempted: dict[str, Any] | None = None  # the rank's preemption report
    diverged: dict[str, Any] | None = None  # the divergence report: step and parameter hashes
    tracking_store: str | None = None  # why the tracking store could not be written
    restores: list[dict[str, Any]] = field(default_factory=list)  # which copy each node of a plain script restored
    errors: list[dict[str, Any]] = field(default_factory=list)  # the first errors the ranks reported
    logs: dict[int, str] = field(default_factory=dict)  # node -> its log among the attempt's artifacts
    details: dict[str, Any] = field(default_factory=dict)  # what else the verdict names: its limit, nodes, ranks

    def as_dict(self, stacks: bool = True) -> dict[str, Any]:
        """The record: the parts this verdict has, as one flat JSON object (the silent node's
        fields and the details at its top level)."""
        record: dict[str, Any] = {}
        for name in ("exit_codes", "finished_ranks"):
            if getattr(self, name) is not None:
                record[name] = getattr(self, name)
        if self.failed_ranks:
            record["failed_ranks"] = [f.as_dict() for f in self.failed_ranks]
        if self.rule is not None:
            record["rule"] = asdict(self.rule)
        if self.silent_node is not None:
            record.update({k: v for k, v in asdict(self.silent_node).items() if v is not None and v != {}})
        if self.storage_calls:
            record["storage_calls"] = [asdict(call) for call in self.storage_calls]
        if stacks and self.stacks:
            record["stacks"] = self.stacks
        if self.stragglers:
            record["stragglers"] = [s.as_dict() for s in self.stragglers]
        for name in ("preempted", "diverged", "tracking_store"):
            if getattr(self, name) is not None:
                record[name] = getattr(self, name)
        if self.restores:
            record["restores"] = self.restores
        record.update(self.details)
        record["errors"] = self.errors
        record["logs"] = self.logs
        return record
