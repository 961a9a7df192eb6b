"""The orchestrator's side of the status channel: what every node (or rank) of the current attempt
has said, kept so that watching it costs per node, not per rank.

Streams arrive through one event loop (status_loop.py). A node relay's stream (NodeHello) speaks for
the ranks of its node: marks (heartbeat ages, step watermarks, compute times), the sums of each
step's losses, and every other rank message verbatim; a rank that reports to the orchestrator
itself (Hello) is a stream of one rank. Either way a stream is bound to the identity of its hello:
a rank is heard from one node and one process for the whole attempt, a rank outside the world is
not heard, and messages of another attempt count only once (or as long as) that one runs.

It keeps, per rank, the last heartbeat, the last step and when that step was reached; per node,
the oldest heartbeat and the oldest progress of its ranks, updated as reports are applied, so the
watcher reads a summary (`summary()`) instead of copying every rank. Step reports go to `steps`,
the nodes' figures to `metrics`, the ranks' events to `events`, for the watch task. An attempt has
finished only once every rank of its world has reported `finished`, each from its own stream, at
the step the orchestrator saw it reach.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any

from trainflow.contracts import WorkerMilestones
from trainflow.contracts.status_protocol import (
    Diverged,
    Error,
    Event,
    Finished,
    Heartbeat,
    Hello,
    Malformed,
    NodeHello,
    NodeReport,
    Preempted,
    Progress,
    RankEvent,
    RankMark,
    Replaced,
    Resources,
    RestartedInPlace,
    Restored,
    Started,
    StepSum,
    decode_object,
    plain,
)
from trainflow.orchestrator.rank_steps import StepReport, mean_over_ranks
from trainflow.orchestrator.status_limits import ChannelLimits
from trainflow.orchestrator.status_loop import ChannelLoop

log = logging.getLogger(__name__)

COMPUTE_WINDOW = 64  # recent per-step compute times kept per rank, for straggler detection
IDENTITY_FIELDS = ("rank", "node", "attempt", "pid")


@dataclass
class RankStatus:
    rank: int
    node: int
    pid: int | None = None
    last_seen: float = 0.0
    step: int = 0
    step_time_s: float | None = None
    progressed_at: float = 0.0
    compute_s: deque = field(default_factory=lambda: deque(maxlen=COMPUTE_WINDOW))


@dataclass
class NodeStatus:
    """A node's ranks at a glance, kept as their reports are applied."""

    node: int
    ranks: set[int] = field(default_factory=set)
    oldest_seen: float = float("inf")  # the oldest heartbeat of its ranks that are not leaving
    oldest_rank: int | None = None
    least_progressed_at: float = 0.0  # the oldest progress of its ranks; 0: one has not stepped yet
    slowest_step_s: float = 0.0


@dataclass(frozen=True)
class RankReport:
    """A rank's event as the orchestrator received it, with who sent it."""

    rank: int
    node: int
    attempt: int
    pid: int | None
    message: Event

    def as_dict(self) -> dict[str, Any]:
        """The event as one flat record (a commit in the flow's feed, an attempt's evidence)."""
        return {**plain(self.message), "rank": self.rank, "node": self.node, "attempt": self.attempt, "pid": self.pid}


@dataclass
class AttemptStatus:
    attempt: int
    world_size: int | None = None  # None: as the workers announce it (their `started` messages)
    started_at: float = field(default_factory=time.time)
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    nodes: dict[int, NodeStatus] = field(default_factory=dict)
    finished: dict | None = None  # once every rank has finished: rank 0's report, loss the mean over ranks
    finished_ranks: dict[int, dict] = field(default_factory=dict)  # each rank's own finished report
    errors: list[dict] = field(default_factory=list)
    restored_step: int | None = None
    first_step_at: float | None = None
    milestones: WorkerMilestones = field(default_factory=WorkerMilestones)  # the slowest rank's start-up
    preempted: dict | None = None
    diverged: dict | None = None
    error_ranks: set[int] = field(default_factory=set)
    nodes_heard: dict[int, float] = field(default_factory=dict)  # node -> when its relay's last line came
    # round -> (rank, report) of each rank that went back to its memory copy in place
    in_place: dict[int, list[tuple[int, RestartedInPlace]]] = field(default_factory=dict)

    def min_step(self) -> int:
        return min((r.step for r in self.ranks.values()), default=0)

    def max_step(self) -> int:
        return max((r.step for r in self.ranks.values()), default=0)

    def all_finished(self) -> bool:
        """Every rank of the world reported finished, all at one step, the step each was seen at."""
        if not self.world_size or len(self.finished_ranks) != self.world_size:
            return False
        if set(self.finished_ranks) != set(range(self.world_size)):
            return False
        steps = {report["step"] for report in self.finished_ranks.values()}
        return len(steps) == 1 and all(self.ranks[rank].step in steps for rank in self.finished_ranks)

    def leaving(self) -> set[int]:
        """Ranks that said they are leaving (finished, raised, preempted, diverged): their
        heartbeats stop on purpose."""
        if self.preempted is not None or self.diverged is not None:
            return set(self.ranks)  # every rank stops at the same control point
        return set(self.finished_ranks) | self.error_ranks


@dataclass(frozen=True)
class AttemptSummary:
    """What the watcher reads every poll, at a cost per node."""

    attempt: int
    world_size: int | None
    started_at: float
    first_step_at: float | None
    known: int  # ranks heard from
    leaving: int  # of them, ranks that said they are leaving
    silent_rank: int | None  # the rank with the oldest heartbeat among those not leaving
    silent_node: int | None
    silent_since: float
    stalled_since: float  # the oldest progress of any rank (the first step's time for one yet to step)
    slowest_step_s: float
    max_step: int
    # the node whose relay, its stream still open, was heard from longest ago (a plain script's
    # node has no rank to hear from: its relay's heartbeats are all there is)
    quiet_node: int | None = None
    quiet_since: float = float("inf")


class StatusServer:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        limits: ChannelLimits = ChannelLimits(),
    ):
        self.token = secrets.token_hex(16)
        self.limits = limits
        self.steps: queue.Queue[StepReport | StepSum] = queue.Queue()  # the steps as ranks or nodes report them
        self.metrics: queue.Queue = queue.Queue()  # (step, t, figures) of the nodes' resources
        self.events: queue.Queue[RankReport] = queue.Queue()
        self._lock = threading.Lock()
        self._attempt = AttemptStatus(attempt=0)
        self._open: Counter[tuple[int, int]] = Counter()  # (attempt, node) -> streams not yet at their end
        self._loop = ChannelLoop(host, port, self.token, limits, self._open_stream)
        bound_host, self.port = self._loop.address
        self.host = advertise_host or bound_host  # where workers connect; may differ from 0.0.0.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def begin_attempt(self, attempt: int, world_size: int | None = None) -> None:
        """From now on only attempt `attempt` counts; it has `world_size` ranks (None: as announced)."""
        with self._lock:
            self._attempt = AttemptStatus(attempt=attempt, world_size=world_size)
            # what the last attempt's workers sent after its watch ended (errors of ranks being
            # stopped, their last steps) is theirs: the next watcher must not read it as its own
            for queued in (self.steps, self.metrics, self.events):
                while True:
                    try:
                        queued.get_nowait()
                    except queue.Empty:
                        break

    def snapshot(self) -> AttemptStatus:
        """A consistent copy of everything known about the current attempt (per rank: for verdicts
        and tests; the watcher's polls read `summary()`)."""
        with self._lock:
            current = self._attempt
            return replace(
                current,
                ranks={
                    k: replace(v, compute_s=deque(v.compute_s, maxlen=COMPUTE_WINDOW)) for k, v in current.ranks.items()
                },
                nodes={k: replace(v, ranks=set(v.ranks)) for k, v in current.nodes.items()},
                nodes_heard=dict(current.nodes_heard),
                finished=dict(current.finished) if current.finished else None,
                finished_ranks={k: dict(v) for k, v in current.finished_ranks.items()},
                errors=list(current.errors),
                milestones=replace(current.milestones),
                error_ranks=set(current.error_ranks),
                in_place={k: list(v) for k, v in current.in_place.items()},
            )

    def summary(self) -> AttemptSummary:
        with self._lock:
            current = self._attempt
            everyone_leaving = current.preempted is not None or current.diverged is not None
            leaving = len(current.ranks) if everyone_leaving else len(set(current.finished_ranks) | current.error_ranks)
            silent = (
                None
                if everyone_leaving
                else min(
                    (n for n in current.nodes.values() if n.oldest_rank is not None),
                    key=lambda n: n.oldest_seen,
                    default=None,
                )
            )
            quiet = min(
                ((heard, node) for node, heard in current.nodes_heard.items() if self._open[(current.attempt, node)]),
                default=None,
            )
            fallback = current.first_step_at or current.started_at
            stalled = min((n.least_progressed_at or fallback for n in current.nodes.values()), default=fallback)
            return AttemptSummary(
                attempt=current.attempt,
                world_size=current.world_size,
                started_at=current.started_at,
                first_step_at=current.first_step_at,
                known=len(current.ranks),
                leaving=leaving,
                silent_rank=silent.oldest_rank if silent else None,
                silent_node=silent.node if silent else None,
                silent_since=silent.oldest_seen if silent else float("inf"),
                stalled_since=stalled,
                slowest_step_s=max((n.slowest_step_s for n in current.nodes.values()), default=0.0),
                max_step=max((r.step for r in current.ranks.values()), default=0)
                if len(current.ranks) < 64
                else self._max_step_of_nodes(current),
                quiet_node=quiet[1] if quiet else None,
                quiet_since=quiet[0] if quiet else float("inf"),
            )

    @staticmethod
    def _max_step_of_nodes(current: AttemptStatus) -> int:
        # the ranks move in lockstep; any rank of each node is as good as another
        return max((current.ranks[min(n.ranks)].step for n in current.nodes.values() if n.ranks), default=0)

    def compute_means(self, window: int) -> dict[int, tuple[int, float, int]]:
        """rank -> (node, mean compute time over its last `window` steps, step), for ranks with that many."""
        with self._lock:
            out = {}
            for rank, status in self._attempt.ranks.items():
                times = status.compute_s
                if len(times) >= window:
                    recent = list(times)[-window:]
                    out[rank] = (status.node, sum(recent) / window, status.step)
            return out

    def read_through(self) -> float:
        """The time up to which every stream has been read: whatever a worker sent before it is
        seen. Silence is measured up to this time, never up to a clock the reader may lag behind."""
        return self._loop.read_through

    def errors(self) -> list[dict]:
        """The current attempt's error reports, in the order they came (a copy)."""
        with self._lock:
            return list(self._attempt.errors)

    def open_connections(self, nodes) -> int:
        """How many of the current attempt's streams from these nodes are still being read: a
        worker's last messages are applied only once its stream reached its end."""
        with self._lock:
            return sum(self._open[(self._attempt.attempt, node)] for node in nodes)

    def close(self) -> None:
        self._loop.close()

    # ---- streams ----------------------------------------------------------------------------------

    def _open_stream(self, hello: Hello | NodeHello, peer: str):
        for name in ("node", "attempt") + (("rank",) if isinstance(hello, Hello) else ()):
            if getattr(hello, name) < 0:
                log.warning("status channel: dropped a connection from %s: hello without a valid %s", peer, name)
                return None
        stream = _RankStream(self, hello, peer) if isinstance(hello, Hello) else _NodeStream(self, hello, peer)
        with self._lock:
            self._open[(hello.attempt, hello.node)] += 1
            if isinstance(hello, NodeHello):
                self._heard(hello.attempt, hello.node, time.time())
            else:
                said = Replaced(pids=list(hello.replaces)) if hello.replaces else Heartbeat()
                self._apply(hello.attempt, hello.node, stream, [(hello.rank, hello.pid, said, time.time())])
        return stream

    def _heard(self, attempt: int, node: int, read_at: float) -> None:
        """A line of a node's relay (under the lock): the node is alive, whatever it said."""
        if attempt == self._attempt.attempt:
            self._attempt.nodes_heard[node] = read_at

    def _closed(self, attempt: int, node: int) -> None:
        with self._lock:
            self._open[(attempt, node)] -= 1

    def _apply(self, attempt: int, node: int, stream: _Stream, items: list[tuple]) -> None:
        """Apply (rank, pid, message, read_at) items of one stream, under the lock."""
        current = self._attempt
        if attempt != current.attempt:
            return  # a worker of another attempt: it counts once (or as long as) that one runs
        touched: set[int] = set()
        for rank, pid, message, _ in items:
            if isinstance(message, Replaced):  # before the rank's marks from its new pid are read
                self._follow(current, rank, node, pid, message)
        for rank, pid, message, read_at in items:
            if isinstance(message, Replaced):
                continue
            if isinstance(message, StepSum):  # the node's ranks' sum of a step: no one rank's
                if current.first_step_at is None:
                    current.first_step_at = min(read_at, message.t)
                self.steps.put(message)
                continue
            status = self._rank(current, stream, rank, node, pid)
            if status is None:
                continue
            touched.add(node)
            if isinstance(message, RankMark):
                self._mark(current, status, message, read_at)
                continue
            status.last_seen = read_at
            self._rank_message(current, status, message, read_at)
        for n in touched:
            self._refresh_node(current, n)
        if current.finished is None and current.all_finished():
            # rank 0's hash is the run's; the loss is the mean over the ranks
            losses = {r: m["loss"] for r, m in current.finished_ranks.items() if m.get("loss") is not None}
            current.finished = {**current.finished_ranks[0], "loss": mean_over_ranks(losses) if losses else None}
            first = current.ranks[0]
            self.events.put(
                RankReport(
                    0,
                    first.node,
                    current.attempt,
                    first.pid,
                    Finished(
                        step=current.finished["step"],
                        loss=current.finished["loss"],
                        params_sha256=current.finished.get("params_sha256"),
                        t=current.finished["t"],
                    ),
                )
            )

    def _rank(
        self, current: AttemptStatus, stream: _Stream, rank: int, node: int, pid: int | None
    ) -> RankStatus | None:
        """The rank a stream speaks for, unless it may not speak for it now: the rank is outside
        the world, or another node or process has spoken for it (a worker keeps its pid for the
        whole attempt)."""
        status = current.ranks.get(rank)
        if status is not None and status.pid == pid and status.node == node:
            return status
        if current.world_size is not None and rank >= current.world_size:
            stream.refuse(rank, f"attempt {current.attempt} has ranks 0-{current.world_size - 1}")
            return None
        if status is not None:
            stream.refuse(
                rank,
                f"rank {rank} is process {status.pid} of node {status.node} in attempt "
                f"{current.attempt}, not {pid} of node {node}",
            )
            return None
        status = current.ranks[rank] = RankStatus(rank=rank, node=node, pid=pid)
        current.nodes.setdefault(node, NodeStatus(node)).ranks.add(rank)
        return status

    @staticmethod
    def _follow(current: AttemptStatus, rank: int, node: int, pid: int | None, replaced: Replaced) -> None:
        """A rank of this node speaks from a new process, started in place of one that died: the
        one it was started in place of must be the one the rank was, on the same node."""
        status = current.ranks.get(rank)
        if status is not None and status.node == node and status.pid in replaced.pids and pid is not None:
            log.info("status channel: rank %d is process %d now, in place of %d", rank, pid, status.pid)
            status.pid = pid

    @staticmethod
    def _mark(current: AttemptStatus, status: RankStatus, mark: RankMark, read_at: float) -> None:
        status.last_seen = max(status.last_seen, read_at - mark.seen_age_s)
        if mark.step >= status.step:
            status.step = mark.step
        if mark.progressed_age_s is not None:
            status.progressed_at = max(status.progressed_at, read_at - mark.progressed_age_s)
        if mark.step_time_s is not None:
            status.step_time_s = mark.step_time_s
        if mark.compute_n:
            status.compute_s.extend([mark.compute_sum_s / mark.compute_n] * min(mark.compute_n, COMPUTE_WINDOW))

    def _rank_message(self, current: AttemptStatus, status: RankStatus, message: Any, now: float) -> None:
        rank = status.rank
        match message:
            case Heartbeat():
                pass
            case Progress(steps=steps):  # a batch of steps: one message per step would cost tiny steps dearly
                for entry in steps:
                    status.step = entry.step
                    status.step_time_s = entry.step_time_s
                    if entry.compute_s is not None:
                        status.compute_s.append(entry.compute_s)
                    if current.first_step_at is None:
                        current.first_step_at = min(now, entry.t if entry.t is not None else now)
                    self.steps.put(StepReport.of_entry(rank, entry, message.t))
                status.progressed_at = now
            case Resources(figures=figures):  # named like MLflow's system metrics, one set per node
                named = {f"system/node_{status.node}/{name}": value for name, value in figures.items()}
                self.metrics.put((current.max_step(), message.t, named))
            case Finished():  # the attempt's finish is one event, once every rank has finished
                self._event(current, status, RankReport(rank, status.node, current.attempt, status.pid, message))
            case _:
                report = RankReport(rank, status.node, current.attempt, status.pid, message)
                self._event(current, status, report)
                self.events.put(report)

    @staticmethod
    def _event(current: AttemptStatus, status: RankStatus, report: RankReport) -> None:
        message = report.message
        match message:
            case Started():
                if current.world_size is None and message.world_size:
                    current.world_size = message.world_size
                for point in ("process_started_at", "imported_at", "rendezvous_at"):
                    current.milestones.reached(point, getattr(message, point))
            case Restored(step=step):
                current.restored_step = step
                status.step = max(status.step, step)
                current.milestones.reached("restored_at", message.t)
            case Finished():
                current.finished_ranks[status.rank] = report.as_dict()
            case Error():
                current.errors.append(report.as_dict())
                current.error_ranks.add(status.rank)
            case RestartedInPlace(round=number):
                current.in_place.setdefault(number, []).append((status.rank, message))
            case Preempted(signalled=signalled):
                if current.preempted is None or signalled:
                    current.preempted = report.as_dict()  # prefer the rank that received the signal
            case Diverged():
                current.diverged = report.as_dict()

    @staticmethod
    def _refresh_node(current: AttemptStatus, node: int) -> None:
        summary = current.nodes.get(node)
        if summary is None:
            return
        everyone_leaving = current.preempted is not None or current.diverged is not None
        oldest, oldest_rank, least, slowest = float("inf"), None, float("inf"), 0.0
        for rank in summary.ranks:
            status = current.ranks[rank]
            if not everyone_leaving and rank not in current.finished_ranks and rank not in current.error_ranks:
                if status.last_seen < oldest:
                    oldest, oldest_rank = status.last_seen, rank
            least = min(least, status.progressed_at)
            slowest = max(slowest, status.step_time_s or 0.0)
        summary.oldest_seen, summary.oldest_rank = oldest, oldest_rank
        summary.least_progressed_at = 0.0 if least == float("inf") else least
        summary.slowest_step_s = slowest


class _Stream:
    """One accepted connection: what it may say is bound to its hello."""

    def __init__(self, server: StatusServer, hello: Hello | NodeHello, peer: str):
        self.server = server
        self.attempt = hello.attempt
        self.node = hello.node
        self.peer = peer
        self._dropped = 0
        self._refused = False

    def refuse(self, rank: int, reason: str) -> None:
        if not self._refused:
            self._refused = True
            log.warning("status channel: ignoring rank %d from %s: %s", rank, self.peer, reason)

    def drop(self, reason: str) -> None:
        self._dropped += 1
        if self._dropped == 1:
            log.warning("status channel: dropped a message from %s (%s): %s", self.peer, self, reason)

    def closed(self) -> None:
        if self._dropped > 1:
            log.warning("status channel: dropped %d messages in all from %s (%s)", self._dropped, self.peer, self)
        self.server._closed(self.attempt, self.node)


class _RankStream(_Stream):
    """A rank reporting to the orchestrator itself: its messages speak for the rank of its hello."""

    def __init__(self, server: StatusServer, hello: Hello, peer: str):
        super().__init__(server, hello, peer)
        self.rank = hello.rank
        self.pid = hello.pid

    def __str__(self) -> str:
        return f"rank {self.rank}"

    def lines(self, lines: list[bytes], read_at: float) -> None:
        items = []
        for line in lines:
            try:
                message = decode_object(line, strip=self._claims)
            except Malformed as exc:
                self.drop(str(exc))
                continue
            items.append((self.rank, self.pid, message, read_at))
        if items:
            with self.server._lock:
                self.server._apply(self.attempt, self.node, self, items)

    def _claims(self, data: dict) -> None:
        """Identity fields in a message (as older workers sent them) must be the hello's own."""
        for name in IDENTITY_FIELDS:
            if name in data:
                value = data.pop(name)
                if value != getattr(self, name):
                    raise Malformed(f"claims another {name} ({value!r})")


class _NodeStream(_Stream):
    """A node's relay: its messages speak for ranks of its node."""

    def __str__(self) -> str:
        return f"node {self.node}"

    def lines(self, lines: list[bytes], read_at: float) -> None:
        items: list[tuple] = []
        for line in lines:
            try:
                message = decode_object(line)
            except Malformed as exc:
                self.drop(str(exc))
                continue
            match message:
                case NodeReport(marks=marks, sums=sums):
                    items.extend((mark.rank, mark.pid, mark, read_at) for mark in marks)
                    items.extend((None, None, step_sum, read_at) for step_sum in sums)
                case RankEvent(rank=rank, pid=pid, message=event):
                    items.append((rank, pid, event, read_at))
                case _:
                    self.drop(f"a {type(message).kind!r} message on a node's stream")
        with self.server._lock:
            self.server._heard(self.attempt, self.node, read_at)
            if items:
                self.server._apply(self.attempt, self.node, self, items)
