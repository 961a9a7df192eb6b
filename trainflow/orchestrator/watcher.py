"""Watching one attempt: exits, heartbeats and progress, until it ends or something is wrong.

- crash: a node's processes exit; noticed within one poll (0.1 s)
- node lost: a node's heartbeats stop while its processes have not exited (network cut, frozen host)
- hang: heartbeats continue but no rank advances for the hang timeout, or a worker is frozen while
  its node is alive; stacks of every rank are captured before the attempt is ended
- straggler: a rank's compute time stays above a factor of the others' median; reported, not fatal
- storage outage: no progress for the hang timeout while ranks report being blocked in a call to
  the checkpoint store; INFRA with the last storage error, not a hang
- exit: a node's ranks are still running `exit_timeout_s` after another node's all exited 0 (a
  rank deadlocked at interpreter exit, a thread that never ends): a hang, with the stacks of the
  ranks still running
- tracking store down: it refused every write for `tracking.store_patience_s`; INFRA, and the
  attempt is stopped with an emergency checkpoint rather than trained on unrecorded
- start-up: no rank reports within `startup_timeout_s` of launch, or none steps within it, or some
  ranks never report (named): a hang before the first step (with stacks), never an infrastructure
  failure

Each poll reads the channel's summary, whose cost follows the number of nodes; every rank is
copied only for a verdict, and stragglers are scored every few seconds at most.

An exit is classified only once every agent of a node whose worker died has exited too, so its
own exit code and failure report are in: a lingering agent (node 0's hosts the rendezvous store)
never turns a finished attempt into a failed one. Nor while every failure seen is a peer's going
away (a closed connection, a lost rendezvous store) and a node still runs: the node of the rank
that went first, however slowly a loaded machine lets it exit, holds the cause. Plain torchrun
scripts (`workload.mode: plain`) report nothing, so they are watched by their exits only.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainflow.backends import AttemptHandle, Launcher
from trainflow.backends.abilities import (
    DescribesNodes,
    DumpsStacks,
    EndsRanks,
    KnowsRankProcesses,
    KnowsReplacedRanks,
    ProbesNodes,
)
from trainflow.contracts.evidence import AttemptEvidence, FailedRank, SilentNode, StorageCall
from trainflow.contracts.status_protocol import Checkpoint, Storage
from trainflow.orchestrator.attempt_metrics import AttemptMetrics
from trainflow.orchestrator.failures import (
    AttemptResult,
    Outcome,
    PlainWindow,
    classify_exit,
    only_symptoms,
    rank_failures,
)
from trainflow.orchestrator.in_place import in_place_restarts
from trainflow.orchestrator.rules import match_rules, ruled_outcome
from trainflow.orchestrator.status import AttemptStatus, AttemptSummary, RankReport, StatusServer
from trainflow.orchestrator.step_metrics import MetricRows
from trainflow.orchestrator.stragglers import Straggler, StragglerWatch
from trainflow.runspec import FaultTolerance

HANG_FLOOR_S = 30.0
HANG_STEP_FACTOR = 20.0
METRICS_FLUSH_S = 1.0
# after a worker dies its agent stops the node's other workers and exits with its failure report,
# within a second or two; on a loaded machine it can take much longer, and nothing is decided before
AGENT_EXIT_WAIT_S = 60.0
log = logging.getLogger("trainflow.watcher")


@dataclass
class HangInPlace:
    """A frozen rank the watcher ended so that its node's agent starts another process in its place
    (fault_tolerance.in_process_restart): the hang's verdict, kept until the round recovers it."""

    verdict: AttemptResult
    rank: int
    pid: int  # the frozen process
    rounds: int  # the recoveries in place recorded when it was ended
    since: float


# an exited process's sockets are closed by its kernel; one that stays open belongs to a node whose
# network went with it, and is not waited for longer than this
CHANNEL_DRAIN_WAIT_S = 10.0


@dataclass(frozen=True)
class WatchLimits:
    heartbeat_timeout_s: float
    hang_timeout_s: float | None
    straggler_factor: float = 1.5
    straggler_steps: int = 5
    startup_timeout_s: float = 600.0
    exit_timeout_s: float = 300.0
    plain_startup_window_s: float = 60.0

    def hang_after(self, status: AttemptSummary) -> float:
        if self.hang_timeout_s is not None:
            return self.hang_timeout_s
        return max(HANG_FLOOR_S, HANG_STEP_FACTOR * status.slowest_step_s)


class AttemptWatcher:
    def __init__(
        self,
        launcher: Launcher,
        handle: AttemptHandle,
        channel: StatusServer,
        limits: WatchLimits,
        world_size: int,
        resumed_from_step: int,
        on_metrics: Callable[[MetricRows], None],
        on_event: Callable[[RankReport | Straggler], None],
        step_metrics_every_s: float = 0.0,
        mean_metrics: tuple[str, ...] = (),
        final_step: int | None = None,
        plain: bool = False,
        fault_tolerance: FaultTolerance | None = None,
        tracking_fault: Callable[[], str | None] = lambda: None,
    ):
        self.plain = plain  # a plain torchrun script: no reports, only exits
        self.fault_tolerance = fault_tolerance or FaultTolerance()  # its rules: the spec's, then built-in
        self.tracking_fault = tracking_fault  # why the tracking store is down; None while it works
        self.launcher = launcher
        self.handle = handle
        self.channel = channel
        self.limits = limits
        self.world_size = world_size
        self.resumed_from_step = resumed_from_step
        self.on_metrics = on_metrics
        self.on_event = on_event
        self._metrics = AttemptMetrics(world_size, step_metrics_every_s, mean_metrics, final_step)
        self.totals = self._metrics.totals  # the ledger's sums; checkpoint stalls are added here
        self._flushed_at = time.monotonic()
        self._straggler_watch = StragglerWatch(limits.straggler_factor, limits.straggler_steps)
        self.stragglers = self._straggler_watch.stragglers
        self._storage_calls: dict[int, RankReport] = {}  # rank -> the storage call it is blocked in
        self._storage_error = ""  # the last failed checkpoint's reason
        self._leaving_since: float | None = None
        self._done_since: float | None = None  # when the first node was through with the job
        self._hang_in_place: HangInPlace | None = None
        self._hangs_ended = 0
        self._hang_recovered_at = 0.0

    def run(self, poll_s: float = 0.1) -> AttemptResult:
        try:
            while True:
                self._pump()
                verdict = self._check()
                if verdict is not None:
                    self._pump()  # steps reported while it was judged count in its totals, as in MLflow
                    verdict.totals = dict(self.totals)
                    return verdict
                time.sleep(poll_s)
        finally:
            self._pump()
            self._metrics.close()
            self._flush()

    def _check(self) -> AttemptResult | None:
        now = time.time()
        exits = self.launcher.poll(self.handle)
        # silence and stalls count up to when the channel had read everything, taken before the
        # summary: what a starved reader has not read yet is no silence of the workers
        seen = min(now, self.channel.read_through())
        status = self.channel.summary()
        if self._hang_in_place is not None:
            verdict = self._follow_hang_in_place(self._hang_in_place, exits, now)
            if verdict is not None or self._hang_in_place is not None:
                return verdict  # nothing else is judged while a frozen rank's replacement rejoins
        if any(e.failing for e in exits) or all(not e.running for e in exits):
            verdict = self._ended_by_exit(exits, now)
            if verdict is not None:
                return verdict
            exits = self.launcher.poll(self.handle)  # the workers that had gone had finished
        if any(e.done for e in exits):
            verdict = self._exit_overdue(exits, now)
            if verdict is not None:
                return verdict
        fault = self.tracking_fault()
        if fault is not None:
            evidence = AttemptEvidence(tracking_store=fault)
            return self._result(Outcome.INFRA, fault, self.channel.snapshot(), now, None, evidence)

        if self.plain:
            return self._silent_plain_node(status, now, seen)
        if not status.known:
            if now - self.handle.started_at > self.limits.startup_timeout_s:
                reason = (
                    f"no worker reported within fault_tolerance.startup_timeout_s "
                    f"({self.limits.startup_timeout_s:g}s) of launch"
                )
                details: dict[str, Any] = {"startup_timeout_s": self.limits.startup_timeout_s}
                if isinstance(self.launcher, DescribesNodes):  # why nothing started, as the backend sees it
                    details["nodes_seen"] = self.launcher.describe(self.handle)
                return self._hung(reason, self.channel.snapshot(), now, None, AttemptEvidence(details=details))
            return None

        self._watch_stragglers(status)
        # a rank that said it is leaving (finished, raised, preempted, diverged) has stopped its
        # heartbeats on purpose; its exit decides, however long a loaded machine takes to deliver it
        if status.leaving:
            since = self._leaving_since = self._leaving_since or now
            if status.leaving == status.known and now - since > AGENT_EXIT_WAIT_S:
                full = self.channel.snapshot()
                reason = f"every rank said it was leaving but the processes did not exit within {AGENT_EXIT_WAIT_S:g}s"
                return self._hung(
                    reason, full, now, since, AttemptEvidence(details={"leaving": sorted(full.leaving())})
                )
        rank, node, last_seen = status.silent_rank, status.silent_node, status.silent_since
        silent_s = seen - last_seen
        if (
            rank is not None
            and node is not None
            and silent_s > self.limits.heartbeat_timeout_s
            and silent_s > self._silence_allowed(rank, node)
        ):
            state = self._probe(node)
            full = self.channel.snapshot()
            silent = SilentNode(node, rank, state, round(seen - last_seen, 3), _last_heartbeats(full, now))
            evidence = AttemptEvidence(silent_node=silent)
            if state == "workers-stopped":
                reason = f"rank {rank} on node {node} is frozen while its node is alive"
                verdict = self._hung(reason, full, now, last_seen, evidence)
                return None if self._end_in_place(verdict, rank, node, full, now) else verdict
            reason = f"node {node} (rank {rank}) silent for {seen - last_seen:.1f}s without exiting ({state})"
            return self._result(Outcome.NODE_LOST, reason, full, now, last_seen, evidence)

        if status.known < self.world_size and now - self.handle.started_at > self.limits.startup_timeout_s:
            # some ranks never said a word: named, never taken for a lost node nor waited for forever
            full = self.channel.snapshot()
            missing = sorted(set(range(self.world_size)) - set(full.ranks))
            reason = (
                f"ranks {_ranges(missing)} never reported within fault_tolerance.startup_timeout_s "
                f"({self.limits.startup_timeout_s:g}s) of launch"
            )
            details = {"never_reported": missing, "startup_timeout_s": self.limits.startup_timeout_s}
            return self._hung(reason, full, now, None, AttemptEvidence(details=details))
        if status.known == self.world_size and not status.leaving:
            # a rank yet to report its first step is behind since the attempt's first step, not since
            # launch: a start-up slower than the hang timeout (a loaded host) is no hang
            # a frozen rank recovered in place: its peers stalled while it froze, and train again since
            stalled_since = max(status.stalled_since, self._hang_recovered_at)
            limit = self.limits.hang_after(status) if status.first_step_at else self.limits.startup_timeout_s
            if seen - stalled_since > limit:
                full = self.channel.snapshot()
                stuck = sorted(r.rank for r in full.ranks.values() if (r.progressed_at or 0) <= stalled_since)
                # in an outage every rank waits on the store (each uploads its own files); a rank
                # stuck anywhere else makes it a hang
                if all(rank in self._storage_calls for rank in full.ranks):
                    return self._storage_stall(full, now, stalled_since)
                reason = f"no step progress for {seen - stalled_since:.1f}s (ranks {_ranges(stuck)})"
                reason += " while heartbeats continue"
                if not status.first_step_at:
                    reason += f", no first step within fault_tolerance.startup_timeout_s ({limit:g}s)"
                details = {"ranks": stuck, "hang_timeout_s": limit}
                return self._hung(reason, full, now, stalled_since, AttemptEvidence(details=details))
        return None

    def _silent_plain_node(self, status: AttemptSummary, now: float, seen: float) -> AttemptResult | None:
        """A plain script's ranks say nothing; its node's relay heartbeats all the same. A relay
        silent for the heartbeat timeout, its stream still open and its node not exited, is a node
        cut off (or its agent stopped): lost, as a runtime script's silent node is."""
        node, heard = status.quiet_node, status.quiet_since
        if node is None or seen - heard <= self.limits.heartbeat_timeout_s:
            return None
        state = self._probe(node)
        reason = f"node {node} silent for {seen - heard:.1f}s without exiting ({state})"
        evidence = AttemptEvidence(silent_node=SilentNode(node, None, state, round(seen - heard, 3)))
        return self._result(Outcome.NODE_LOST, reason, self.channel.snapshot(), now, heard, evidence)

    def _exit_overdue(self, exits, now: float) -> AttemptResult | None:
        """Nodes still running long after another node's workers were through with the job: a rank
        that does not exit (a deadlock at interpreter exit, a forgotten thread) holds the job, and
        plain scripts have no heartbeats that would show it."""
        since = self._done_since = self._done_since or now
        if now - since <= self.limits.exit_timeout_s:
            return None
        done = [e.node for e in exits if e.done]
        running = [e.node for e in exits if not e.done]
        reason = (
            f"node {_nodes(running)} still running {now - since:.0f}s after node {_nodes(done)} finished "
            f"(fault_tolerance.exit_timeout_s: {self.limits.exit_timeout_s:g}s)"
        )
        details = {"finished_nodes": done, "running_nodes": running, "exit_timeout_s": self.limits.exit_timeout_s}
        return self._hung(reason, self.channel.snapshot(), now, since, AttemptEvidence(details=details), nodes=running)

    def _ended_by_exit(self, exits, detected_at: float) -> AttemptResult | None:
        """The verdict on an attempt a node has ended or failed; None when the workers that had
        gone turn out to have finished, and other nodes still run."""
        deadline = time.monotonic() + AGENT_EXIT_WAIT_S
        # a worker is gone but its agent still runs: its exit code and failure report are still to come
        while any(e.workers_lost for e in exits) and time.monotonic() < deadline:
            time.sleep(0.05)
            exits = self.launcher.poll(self.handle)
        # a rank that failed only because a peer went away (a connection closed, the rendezvous store
        # gone with the node hosting it) fails within moments of that peer, whose node can take far
        # longer on a loaded machine to exit with the evidence of what went wrong: that node decides
        deadline = time.monotonic() + AGENT_EXIT_WAIT_S
        while (
            any(e.running for e in exits)
            and only_symptoms(exits, self.channel.errors())
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
            exits = self.launcher.poll(self.handle)
        if not any(e.failing for e in exits) and any(e.running for e in exits):
            return None
        # an exited worker's last reports (its steps, its error) may still be in its socket: decide
        # once the channel has read every exited node's connections to their end
        exited = [e.node for e in exits if not e.running]
        deadline = time.monotonic() + CHANNEL_DRAIN_WAIT_S
        while self.channel.open_connections(exited) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._pump()
        status = self.channel.snapshot()
        window = PlainWindow(self.handle.started_at, self.limits.plain_startup_window_s) if self.plain else None
        outcome, reason = classify_exit(exits, status, self.world_size, plain=self.plain, window=window)
        # the workers' own word on a preemption or a divergence stands; any other failure's evidence
        # goes through the rules first
        rule = (
            match_rules(self.fault_tolerance, exits, status)
            if outcome not in (Outcome.SUCCEEDED, Outcome.PREEMPTED, Outcome.DIVERGED)
            else None
        )
        if rule is not None:
            outcome, reason = ruled_outcome(rule, outcome, reason)
        causes = rank_failures(exits, status.errors) if outcome != Outcome.SUCCEEDED else []
        reported = [f.at for f in causes[:1] if f.error is not None]
        failed_at = reported[0] if reported else (status.errors[0]["t"] if status.errors else None)
        if status.preempted and status.preempted.get("requested_at"):
            failed_at = status.preempted["requested_at"]
        evidence = AttemptEvidence(
            exit_codes={e.node: e.returncode for e in exits},
            finished_ranks=sorted(status.finished_ranks),
            # the decision's evidence: failed ranks, earliest first, with their last stderr lines
            failed_ranks=[
                FailedRank(
                    f.rank,
                    f.node,
                    f.exitcode,
                    f.at,
                    (f.error or {}).get("type"),
                    tuple(f.stderr_tail),
                    f.error_line,
                )
                for f in causes
            ],
            rule=rule.record() if rule is not None else None,
            preempted=status.preempted or None,
            diverged=status.diverged or None,
        )
        return self._result(outcome, reason, status, detected_at, failed_at, evidence)

    def _storage_stall(self, status: AttemptStatus, now: float, stalled_since: float) -> AttemptResult:
        """No progress while ranks wait on the checkpoint store: a storage outage (INFRA), not a hang."""
        calls = {rank: r.message for rank, r in self._storage_calls.items() if isinstance(r.message, Storage)}
        first_rank, call = min(calls.items(), key=lambda item: item[1].since)
        reason = (
            f"no step progress for {now - stalled_since:.1f}s: ranks {_ranges(sorted(self._storage_calls))} "
            f"blocked in storage calls, rank {first_rank} for {now - call.since:.1f}s ({call.call})"
        )
        if self._storage_error:
            reason += f"; last storage error: {self._storage_error}"
        blocked = [
            StorageCall(r.rank, r.node, r.message.call, r.message.since)
            for r in self._storage_calls.values()
            if isinstance(r.message, Storage)
        ]
        return self._result(Outcome.INFRA, reason, status, now, call.since, AttemptEvidence(storage_calls=blocked))

    def _hung(
        self,
        reason: str,
        status: AttemptStatus,
        detected_at: float,
        failed_at: float | None,
        evidence: AttemptEvidence,
        nodes: list[int] | None = None,
    ) -> AttemptResult:
        evidence.stacks = self._stacks(status, nodes)
        return self._result(Outcome.HUNG, reason, status, detected_at, failed_at, evidence)

    def _silence_allowed(self, rank: int, node: int) -> float:
        """The heartbeat timeout; for a rank whose process died and whose node's agent has started
        another in its place (rank_replacement.py), the time a new rank process has to report."""
        if not self.handle.in_place_budget or not isinstance(self.launcher, KnowsReplacedRanks):
            return self.limits.heartbeat_timeout_s
        ranked = self.channel.snapshot().ranks.get(rank)
        if ranked is not None and ranked.pid in self.launcher.replaced_pids(self.handle, node):
            return max(self.limits.heartbeat_timeout_s, self.limits.startup_timeout_s)
        return self.limits.heartbeat_timeout_s

    def _end_in_place(self, verdict: AttemptResult, rank: int, node: int, status: AttemptStatus, now: float) -> bool:
        """With in-process restart and a hang's recovery left in the budget: end the frozen rank's
        process, noted as this hang, and let its node's agent start another in its place; its peers,
        blocked in a collective with it, then fail at once and go back to their memory copies."""
        left = self.handle.in_place_budget.get(Outcome.HUNG.value, 0) - self._hangs_ended
        ranked = status.ranks.get(rank)
        if left <= 0 or ranked is None or ranked.pid is None or not isinstance(self.launcher, EndsRanks):
            return False
        if not self.launcher.end_rank(self.handle, node, ranked.pid, verdict.reason, hang=True):
            return False
        self._hangs_ended += 1
        self._hang_in_place = HangInPlace(verdict, rank, ranked.pid, len(status.in_place), now)
        log.warning("%s: process %d ended, to be replaced in place", verdict.reason, ranked.pid)
        return True

    def _follow_hang_in_place(self, pending: HangInPlace, exits, now: float) -> AttemptResult | None:
        """The hang's verdict once its recovery in place cannot happen: a node's agent ended with a
        failure (the rank was not replaced, or its round was no go), or no round recovered it within
        the time a new rank process has to report; None meanwhile, and once a round did and the rank
        is heard from its new process (its peers' reports of the round may come first)."""
        status = self.channel.snapshot()
        ranked = status.ranks.get(pending.rank)
        heard_anew = ranked is not None and ranked.pid != pending.pid and ranked.last_seen >= pending.since
        if len(status.in_place) > pending.rounds and heard_anew:
            self._hang_in_place = None
            self._hang_recovered_at = now
            return None
        if any(e.returncode not in (None, 0) for e in exits) or now - pending.since > self.limits.startup_timeout_s:
            self._hang_in_place = None
            return pending.verdict
        return None

    def _probe(self, node: int) -> str:
        return self.launcher.probe(self.handle, node) if isinstance(self.launcher, ProbesNodes) else "unknown"

    def _stacks(self, status: AttemptStatus, nodes=None) -> dict[int, str]:
        """Every rank's stacks (of the given nodes' ranks); a plain script's ranks, which report
        nothing, as far as the backend knows their processes."""
        if not isinstance(self.launcher, DumpsStacks):
            return {}
        pids = {r.rank: r.pid for r in status.ranks.values() if r.pid and (nodes is None or r.node in nodes)}
        if not status.ranks and isinstance(self.launcher, KnowsRankProcesses):
            pids = self.launcher.rank_processes(
                self.handle, nodes if nodes is not None else list(self.handle.processes)
            )
        return self.launcher.dump_stacks(self.handle, pids)

    def _watch_stragglers(self, status: AttemptSummary) -> None:
        found, scores = self._straggler_watch.check(self.channel, status)
        for report in found:
            self.on_event(report)
        self._metrics.add_rows(scores)

    def _result(
        self,
        outcome: Outcome,
        reason: str,
        status: AttemptStatus,
        detected_at: float,
        failed_at: float | None,
        evidence: AttemptEvidence,
    ) -> AttemptResult:
        evidence.errors = status.errors[:3]
        # the node folders go at teardown; the logs are kept as this attempt's MLflow artifacts
        evidence.logs = {n: f"logs/{p.name}" for n, p in self.handle.logs.items()}
        evidence.stragglers = list(self.stragglers.values())
        return AttemptResult(
            attempt=self.handle.attempt,
            outcome=outcome,
            reason=reason,
            world_size=self.world_size,
            started_at=self.handle.started_at,
            ended_at=time.time(),
            detected_at=detected_at,
            failed_at=failed_at,
            last_step=status.min_step() if status.ranks else (status.restored_step or self.resumed_from_step),
            # what the workers actually loaded (a newer node-local copy may beat the durable one)
            resumed_from_step=status.restored_step if status.restored_step is not None else self.resumed_from_step,
            first_step_at=status.first_step_at,
            milestones=status.milestones,
            finished=status.finished,
            totals=dict(self.totals),
            evidence=evidence,
            in_place=in_place_restarts(status.in_place),
        )

    def _pump(self) -> None:
        while True:
            try:
                self._metrics.add_step(self.channel.steps.get_nowait())
            except queue.Empty:
                break
        while True:
            try:
                self._metrics.add_figures(*self.channel.metrics.get_nowait())
            except queue.Empty:
                break
        while True:
            try:
                event = self.channel.events.get_nowait()
            except queue.Empty:
                break
            match event.message:
                case Storage(state="waiting"):
                    self._storage_calls[event.rank] = event
                case Storage():
                    self._storage_calls.pop(event.rank, None)
                case Checkpoint() as checkpoint:
                    if checkpoint.status == "failed":
                        self._storage_error = (checkpoint.reason or "")[:500]
                    # the time training stood still for it
                    stall = (
                        checkpoint.stall_s
                        if checkpoint.stall_s is not None
                        else sum(s or 0.0 for s in (checkpoint.stage_s, checkpoint.save_s, checkpoint.upload_s))
                    )
                    self.totals["checkpoint_stall_s"] = self.totals.get("checkpoint_stall_s", 0.0) + stall
            self.on_event(event)
        if time.monotonic() - self._flushed_at > METRICS_FLUSH_S:
            self._flush()

    def _flush(self) -> None:
        rows = self._metrics.take()
        if rows:
            self.on_metrics(rows)
        self._flushed_at = time.monotonic()


def _nodes(nodes: list[int]) -> str:
    return ", ".join(str(n) for n in nodes)


def _ranges(ranks: list[int]) -> str:
    """Sorted ranks as runs: `0-7, 9, 12-15` (a job's thousands of ranks in one line)."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _last_heartbeats(status: AttemptStatus, now: float, most: int = 64) -> dict[int, float]:
    """Seconds since each rank's last heartbeat, the oldest first (at most `most` of them)."""
    oldest = sorted(status.ranks.values(), key=lambda r: r.last_seen)[:most]
    return {r.rank: round(now - r.last_seen, 2) for r in oldest}
