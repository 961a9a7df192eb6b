"""The status channel's protocol: everything that crosses the wire between a job's ranks, their
node's relay and the orchestrator. One file to read.

    rank ──(Hello, then rank messages)──▶ node relay ──(NodeHello, then NodeReport / RankEvent)──▶ orchestrator
    rank ◀──────────(Answer / Refused)─── node relay ◀───────────(Answer / Refused)─────────────── orchestrator

Framing: JSON lines, one object per line, UTF-8, each with its `kind`; a line longer than the
receiver's limit closes the connection. The first line of every connection is a hello carrying the
run's token and PROTOCOL_VERSION; a peer of another version is refused (`Refused`, one log line).

A rank talks to its node's relay (its agent's process, see trainflow/relay/); the relay folds its
ranks' heartbeats and steps into one stream per node: per-rank watermarks (`RankMark`), the sum of
each step's losses over its ranks (`StepSum`), and every other message verbatim, stamped with the
rank it came from (`RankEvent`). A rank may also speak to the orchestrator itself (no relay): the
orchestrator accepts a rank's hello as a stream of one rank.

Every receiver answers a stream it accepted (`Answer`) at least every heartbeat interval: a rank
or relay that hears nothing from the orchestrator for `orchestrator_timeout_s` stops its ranks,
whether the orchestrator is gone or frozen.

Stdlib only: the training runtime imports it. Each message is a frozen dataclass; `decode` checks
every field against its annotation, so a reader never meets a field of the wrong type.
"""

from __future__ import annotations

import json
import time
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

PROTOCOL_VERSION = 4


class Malformed(ValueError):
    """A line that is not a message of this protocol; the receiver drops it."""


def _now() -> float:
    return time.time()


# ---- a rank's messages ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The first line of a rank's connection: who it is, proved with the run's token."""

    kind: ClassVar[str] = "hello"
    token: str
    rank: int
    node: int
    attempt: int
    pid: int | None = None
    version: int = 0  # PROTOCOL_VERSION of the sender; 0: a sender older than versions
    # the pids of the rank's processes this one was started in place of, oldest first (a process
    # that died, replaced by its node's agent: backends/rank_replacement.py); [] for the first
    replaces: list[int] = field(default_factory=list)
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Heartbeat:
    kind: ClassVar[str] = "heartbeat"
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class StepEntry:
    """One step a rank trained: rank 0 sends the step's metrics (its loss among them), the others
    only their loss."""

    step: int
    t: float | None = None  # when it ended; None: when the batch was sent
    step_time_s: float | None = None
    compute_s: float | None = None  # the step's time minus its wait in all-reduce
    loss: float | None = None
    metrics: dict[str, float | None] | None = None

    @property
    def rank_loss(self) -> float | None:
        return self.loss if self.loss is not None else (self.metrics or {}).get("loss")


@dataclass(frozen=True)
class Progress:
    """Steps in a batch: one message per step would cost tiny steps dearly."""

    kind: ClassVar[str] = "progress"
    steps: list[StepEntry]
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Started:
    kind: ClassVar[str] = "started"
    world_size: int | None = None
    process_started_at: float | None = None
    imported_at: float | None = None
    rendezvous_at: float | None = None
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Restored:
    kind: ClassVar[str] = "restored"
    step: int
    prefix: str | None = None
    tier: str | None = None
    bytes: int | None = None
    seconds: float = 0.0
    fallbacks: list[str] = field(default_factory=list)
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint committed, failed or rejected at restore, with its timings."""

    kind: ClassVar[str] = "checkpoint"
    step: int
    prefix: str
    status: str  # committed | failed | rejected
    bytes: int = 0
    files: int | None = None
    world_size: int | None = None
    reason: str | None = None
    stall_s: float | None = None
    stage_s: float | None = None
    save_s: float | None = None
    hash_s: float | None = None
    upload_s: float | None = None
    commit_s: float | None = None
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Storage:
    """A rank is blocked in a call to the checkpoint store (`waiting`), or not any more (`done`)."""

    kind: ClassVar[str] = "storage"
    state: str
    since: float
    call: str
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Layout:
    kind: ClassVar[str] = "layout"
    strategy: str
    world_size: int
    dp_degree: int
    tp_degree: int
    pp_degree: int
    mesh: dict[str, int] = field(default_factory=dict)
    replicated: list[str] | None = None
    warnings: list[str] = field(default_factory=list)
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Error:
    """An uncaught exception of a rank's script."""

    kind: ClassVar[str] = "error"
    type: str
    message: str
    traceback: str = ""
    step: int | None = None
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class RestartedInPlace:
    """This rank went back to its in-memory copy after a failure, in the same process, and has
    trained its first step since (runtime/in_place.py). Every rank of the round sends one, naming
    the same cause."""

    kind: ClassVar[str] = "restarted-in-place"
    round: int
    outcome: str  # the failure's outcome, as the ranks classified the cause
    reason: str
    cause_rank: int
    failed_step: int
    restored_step: int
    failed_at: float
    abort_s: float  # this rank's: leaving the step and tearing its process groups down
    rejoin_s: float  # agreeing on the round and forming the new group (with the script's re-run)
    restore_s: float  # loading the in-memory copy
    copy_every_steps: int = 1  # the memory copies' cadence then: the steps a failure may cost
    replaced: bool = False  # this rank's process was started in place of one that died
    replace_s: float = 0.0  # a replaced rank's: from its predecessor's death to its report to the round
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Replaced:
    """The rank speaks from a new process, started in place of `pids` (its hello's `replaces`): a
    node relay passes it on as the rank's event, so the orchestrator follows the rank to its new pid."""

    kind: ClassVar[str] = "replaced"
    pids: list[int]
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Preempted:
    kind: ClassVar[str] = "preempted"
    step: int
    signalled: bool
    requested_at: float | None = None
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Diverged:
    kind: ClassVar[str] = "diverged"
    step: int
    hashes: list[str]
    groups: list[list[int]]
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Finished:
    kind: ClassVar[str] = "finished"
    step: int
    loss: float | None = None
    params_sha256: str | None = None  # rank 0's: the hash of the final parameters
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Resources:
    """One node's figures (CPU, memory, devices), from its local rank 0."""

    kind: ClassVar[str] = "resources"
    figures: dict[str, float | None]
    t: float = field(default_factory=_now)


# what a rank may send after its hello
RankMessage = (
    Heartbeat
    | Progress
    | Started
    | Restored
    | Checkpoint
    | Storage
    | Layout
    | Error
    | RestartedInPlace
    | Preempted
    | Diverged
    | Finished
    | Resources
)
# what the orchestrator passes on to the watch as they are
Event = Started | Restored | Checkpoint | Storage | Layout | Error | RestartedInPlace | Preempted | Diverged | Finished


# ---- a node relay's messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeHello:
    """The first line of a node relay's stream: every later message speaks for ranks of this node."""

    kind: ClassVar[str] = "node-hello"
    token: str
    node: int
    attempt: int
    version: int = 0
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class RankMark:
    """Where one rank of the node stands, as its relay saw it. Ages are seconds before the report
    was sent, so clocks of relay and orchestrator never meet. On the wire a row (a JSON array in
    field order): a node sends thousands of them a second."""

    row: ClassVar[bool] = True
    rank: int
    pid: int | None
    seen_age_s: float  # since the rank's last line (its heartbeat)
    step: int  # the last step it reported (or restored)
    progressed_age_s: float | None = None  # since it reported that step; None: no step yet
    step_time_s: float | None = None
    compute_n: int = 0  # steps whose compute time is summed below, since the last report
    compute_sum_s: float = 0.0


@dataclass(frozen=True)
class StepSum:
    """One step as far as this node's ranks reported it: how many, their losses' sum, and rank 0's
    metrics when rank 0 is one of them."""

    step: int
    t: float
    ranks: int
    loss_sum: float = 0.0
    loss_count: int = 0
    metrics: dict[str, float | None] | None = None


@dataclass(frozen=True)
class NodeReport:
    """A node's ranks since the last report: marks of ranks that changed (all of them, at least
    every heartbeat interval), the steps' sums, and ranks that left the node's relay."""

    kind: ClassVar[str] = "node-report"
    marks: list[RankMark] = field(default_factory=list)
    sums: list[StepSum] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)  # ranks whose connection ended, everything they sent in
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class RankEvent:
    """A rank's message other than steps and heartbeats, as the rank sent it."""

    kind: ClassVar[str] = "rank-event"
    rank: int
    pid: int | None
    message: Event | Resources | Replaced  # a node's figures too: one rank of each node samples them
    t: float = field(default_factory=_now)


# ---- the answers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """The receiver is alive and reads this stream."""

    kind: ClassVar[str] = "answer"
    t: float = field(default_factory=_now)


@dataclass(frozen=True)
class Refused:
    """The stream is not accepted, and why; the connection is closed after it."""

    kind: ClassVar[str] = "refused"
    reason: str
    t: float = field(default_factory=_now)


NodeMessage = NodeReport | RankEvent
Message = Hello | NodeHello | RankMessage | NodeMessage | Answer | Refused

KINDS: dict[str, type] = {
    cls.kind: cls
    for cls in (
        Hello,
        Heartbeat,
        Progress,
        Started,
        Restored,
        Checkpoint,
        Storage,
        Layout,
        Error,
        RestartedInPlace,
        Preempted,
        Diverged,
        Finished,
        Resources,
        NodeHello,
        NodeReport,
        RankEvent,
        Replaced,
        Answer,
        Refused,
    )
}
EVENT_KINDS = frozenset(cls.kind for cls in typing.get_args(Event))


# ---- encoding -------------------------------------------------------------------------------------


def encode(message: Any) -> bytes:
    """One line of the wire: the message as a JSON object with its kind, and a newline."""
    return (json.dumps(plain(message), separators=(",", ":"), allow_nan=False) + "\n").encode()


def decode(line: bytes | str) -> Any:
    """The message of one line; Malformed if it is not JSON, of no known kind, or a field is missing,
    unknown or of another type than its annotation."""
    return decode_object(line)


def decode_object(line: bytes | str, strip: Callable[[dict], None] | None = None) -> Any:
    """As decode; `strip` first sees (and may take fields from, or refuse) the JSON object."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Malformed("not JSON") from None
    if not isinstance(data, dict):
        raise Malformed(f"a JSON {type(data).__name__}, not an object")
    if strip is not None:
        strip(data)
    kind = data.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise Malformed(f"unknown kind {kind!r}" if isinstance(kind, str) else "no kind")
    return _build(cls, data)


def plain(value: Any) -> Any:
    """A message (or any value of one) as JSON values: a message is an object with its kind."""
    spec = _ENCODING.get(type(value)) or (_encoding(type(value)) if hasattr(value, "__dataclass_fields__") else None)
    if spec is not None:
        kind, names = spec
        if getattr(value, "row", False):
            return [getattr(value, name) for name, _ in names]
        out = {"kind": kind} if kind is not None else {}
        for name, omit_none in names:
            item = getattr(value, name)
            if item is None and omit_none:
                continue  # an absent optional field says the same, in fewer bytes
            out[name] = item if type(item) in _SCALARS else plain(item)
        return out
    if isinstance(value, (list, tuple)):
        return [v if type(v) in _SCALARS else plain(v) for v in value]
    if isinstance(value, dict):
        return {k: v if type(v) in _SCALARS else plain(v) for k, v in value.items()}
    return value


_SCALARS = frozenset({int, float, str, bool, type(None)})
_ENCODING: dict[type, tuple[str | None, list[tuple[str, bool]]]] = {}


def _encoding(cls: type) -> tuple[str | None, list[tuple[str, bool]]]:
    spec = _ENCODING[cls] = (getattr(cls, "kind", None), [(f.name, f.default is None) for f in fields(cls)])
    return spec


# ---- decoding: a checker per annotation, compiled once ------------------------------------------------

Check = Callable[[Any, str], Any]
_CHECKS: dict[Any, Check] = {}
_SPECS: dict[type, tuple[dict[str, Check], frozenset[str], bool, str]] = {}


def _spec(cls: type) -> tuple[dict[str, Check], frozenset[str], bool, str]:
    spec = _SPECS.get(cls)
    if spec is None:
        hints = {
            name: hint for name, hint in typing.get_type_hints(cls).items() if typing.get_origin(hint) is not ClassVar
        }
        required = frozenset(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
        # every message says when it was sent; a hello's time is its arrival
        timed = "t" in hints and hasattr(cls, "kind") and cls not in (Hello, NodeHello)
        spec = _SPECS[cls] = (
            {name: _check_of(hint) for name, hint in hints.items()},
            required,
            timed,
            getattr(cls, "kind", cls.__name__),
        )
    return spec


def _build(cls: type, data: dict, where: str = "") -> Any:
    checks, required, timed, label = _spec(cls)
    values = {}
    try:
        for name, value in data.items():
            if name == "kind":
                continue
            check = checks.get(name)
            if check is None:
                raise Malformed(f"{label}: unknown field {name!r}")
            values[name] = check(value, name)
    except Malformed as exc:
        raise Malformed(f"{label}.{exc}" if not str(exc).startswith(label) else str(exc)) from None
    if len(values) < len(required) or not required <= values.keys():
        missing = sorted(required - values.keys())
        raise Malformed(f"{label}: no {missing[0]}")
    if timed and "t" not in values:
        raise Malformed(f"{label}: no time (t)")
    return cls(**values)


def _check_of(hint: Any) -> Check:
    check = _CHECKS.get(hint)
    if check is None:
        check = _CHECKS[hint] = _compile(hint)
    return check


def _compile(hint: Any) -> Check:
    origin = typing.get_origin(hint)
    name = _name(hint)

    def wrong(where: str) -> Malformed:
        return Malformed(f"{where} is not {name}")

    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        nullable = type(None) in options
        kinds = [o for o in options if o is not type(None)]
        if all(hasattr(o, "kind") for o in kinds):  # one of several messages, told apart by kind
            by_kind = {o.kind: o for o in kinds}

            def one_of_messages(value: Any, where: str) -> Any:
                if value is None and nullable:
                    return None
                if type(value) is not dict:
                    raise wrong(where)
                cls = by_kind.get(value.get("kind"))
                if cls is None:
                    raise Malformed(f"{where}: a {value.get('kind')!r} message is not allowed here")
                return _nested(cls, value, where)

            return one_of_messages
        checks = [_check_of(o) for o in kinds]

        def one_of(value: Any, where: str) -> Any:
            if value is None and nullable:
                return None
            for check in checks:
                try:
                    return check(value, where)
                except Malformed:
                    continue
            raise wrong(where)

        return one_of
    if hint is float:

        def number(value: Any, where: str) -> float:
            kind = type(value)
            if kind is float:
                return value
            if kind is int:
                return float(value)
            raise wrong(where)

        return number
    if hint in (int, str, bool):

        def exactly(value: Any, where: str) -> Any:
            if type(value) is not hint:  # a bool is no int here
                raise wrong(where)
            return value

        return exactly
    if origin is list:
        (item,) = typing.get_args(hint)
        check_item = _check_of(item)

        def items(value: Any, where: str) -> list:
            if type(value) is not list:
                raise wrong(where)
            return [check_item(v, where) for v in value]

        return items
    if origin is dict:
        _, item = typing.get_args(hint)
        check_value = _check_of(item)

        def mapping(value: Any, where: str) -> dict:
            if type(value) is not dict:
                raise wrong(where)
            return {k: check_value(v, where) for k, v in value.items()}

        return mapping
    if isinstance(hint, type) and hasattr(hint, "__dataclass_fields__") and getattr(hint, "row", False):
        columns = [(f.name, _check_of(typing.get_type_hints(hint)[f.name])) for f in fields(hint)]
        least = sum(1 for f in fields(hint) if f.default is MISSING and f.default_factory is MISSING)

        def row(value: Any, where: str) -> Any:
            if type(value) is not list or not least <= len(value) <= len(columns):
                raise Malformed(f"{where}: a {hint.__name__} is a list of {least} to {len(columns)} values")
            return hint(*[check(v, name) for (name, check), v in zip(columns, value)])

        return row
    if isinstance(hint, type) and hasattr(hint, "__dataclass_fields__"):

        def record(value: Any, where: str) -> Any:
            if type(value) is not dict:
                raise wrong(where)
            return _nested(hint, value, where)

        return record
    raise TypeError(f"status_protocol: no checker for {hint!r}")


def _nested(cls: type, value: dict, where: str) -> Any:
    try:
        return _build(cls, value)
    except Malformed as exc:
        raise Malformed(f"{where}: {exc}") from None


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("trainflow.contracts.status_protocol.", "")
