"""Outcome kinds, how an ended attempt is classified, and which outcomes are worth a retry."""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass

from trainflow.backends.base import NodeExit
from trainflow.contracts import AttemptResult, Outcome
from trainflow.contracts.exceptions import exception_outcome, is_peer_failure_message
from trainflow.contracts.exit_codes import ORCHESTRATOR_LOST as EXIT_ORCHESTRATOR_LOST
from trainflow.contracts.exit_codes import STORE_UNREACHABLE
from trainflow.orchestrator.status import AttemptStatus
from trainflow.runspec import FaultTolerance

# what a node's agent says when the rendezvous store it talks to, which a peer's agent hosts, is gone
STORE_LOST_SIGNS = (
    "RendezvousConnectionError",
    "The connection to the C10d store has failed",
    "RendezvousClosedError",
)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def is_peer_failure(error: dict) -> bool:
    """An error a rank raised only because another rank went away: a symptom, not the cause."""
    return is_peer_failure_message(str(error.get("message", "")))


def lost_the_store(node_exit: NodeExit) -> bool:
    """The node's agent failed, no rank of it with it, because it could not reach the rendezvous
    store: what a node sees seconds after the node hosting the store went away."""
    return (
        node_exit.failing
        and not node_exit.ranks
        and any(sign in line for line in node_exit.log_tail for sign in STORE_LOST_SIGNS)
    )


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure as the evidence shows it: its own error report, or its exit."""

    rank: int | None  # None: only the node is known (a backend without per-rank evidence)
    node: int
    at: float | None  # when it failed (its report's time, or when its launcher saw it)
    error: dict | None = None  # the rank's own error report
    exitcode: int | None = None  # negative: killed by that signal; None: died, code unknown
    stderr_tail: tuple[str, ...] = ()
    error_line: str = ""  # the exception line of torchrun's error file for that rank, if it wrote one

    @property
    def who(self) -> str:
        return f"node {self.node}" if self.rank is None else f"rank {self.rank} on node {self.node}"


def last_line(lines: tuple[str, ...] | list[str]) -> str:
    """The script's own last word: the final line of its stderr."""
    return lines[-1].strip()[:500] if lines else ""


_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]: ?")
_TRACEBACK = "Traceback (most recent call last):"
# an exception's own line ("RuntimeError: ...", "torch.OutOfMemoryError: ...") or an error a
# program prints before it exits ("train.py: error: argument --lr: ...")
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b|.*\berror\b)", re.I)


def _without_rank_prefix(lines: tuple[str, ...] | list[str]) -> list[str]:
    return [_RANK_PREFIX.sub("", line).rstrip() for line in lines]


def exception_line(lines: tuple[str, ...] | list[str]) -> str:
    """The line that says why a rank failed: the exception line ending its last traceback, else the
    last line that reads as an error; "" when there is none (never a warning or a source line)."""
    cleaned = _without_rank_prefix(lines)
    starts = [i for i, line in enumerate(cleaned) if line.strip() == _TRACEBACK]
    if starts:
        for line in cleaned[starts[-1] + 1 :]:
            if line and not line[0].isspace():
                return line.strip()[:500]
    for line in reversed(cleaned):
        if line and not line[0].isspace() and _ERROR_LINE.match(line) and "Warning" not in line:
            return line.strip()[:500]
    return ""


def rank_failures(exits: list[NodeExit], errors: list[dict], symptoms: bool = True) -> list[RankFailure]:
    """Every failure that could be the cause, earliest first, from the nodes' exits and the ranks'
    error reports. A rank that only reported a peer's disappearance (in its error report, or as the
    last line of its stderr), or that its own agent stopped after a node-mate failed, is a symptom
    and left out, unless there is nothing else and `symptoms` allows them. Without `symptoms`, a
    node that only lost the rendezvous store is left out too: nothing but causes."""
    reports: dict[int, dict] = {}
    for error in errors:
        reports.setdefault(int(error.get("rank", -1)), error)
    victims = {rank for rank, error in reports.items() if is_peer_failure(error)}
    found: dict[int, RankFailure] = {}
    echoes: dict[int, RankFailure] = {}  # exits whose last stderr line is only a peer's going away
    for rank, error in reports.items():
        if rank not in victims:
            found[rank] = RankFailure(rank, int(error.get("node", -1)), error.get("t"), error=error)
    nodes_without_ranks = []
    for node_exit in exits:
        if not node_exit.failing:
            continue
        if not node_exit.ranks:
            nodes_without_ranks.append(node_exit)
            continue
        for rank_exit in node_exit.ranks:
            stopped_by_agent = not rank_exit.root_cause and rank_exit.exitcode == -signal.SIGTERM
            if rank_exit.rank in victims or stopped_by_agent:
                continue
            known = found.get(rank_exit.rank)
            failure = RankFailure(
                rank_exit.rank,
                node_exit.node,
                known.at if known else rank_exit.observed_at,
                error=known.error if known else None,
                exitcode=rank_exit.exitcode,
                stderr_tail=rank_exit.stderr_tail,
                error_line=rank_exit.error_line,
            )
            echo = known is None and is_peer_failure({"message": last_line(rank_exit.stderr_tail)})
            (echoes if echo else found)[rank_exit.rank] = failure
    if not found and symptoms:  # nothing but echoes: they are the evidence there is
        found.update(echoes)
    symptomatic = {int(reports[r].get("node", -1)) for r in victims}
    reported_nodes = {f.node for f in [*found.values(), *echoes.values()]}
    for node_exit in nodes_without_ranks:
        if node_exit.node in symptomatic or node_exit.node in reported_nodes:
            continue
        if not symptoms and lost_the_store(node_exit):
            continue
        code = node_exit.worker_returncode if node_exit.worker_returncode is not None else node_exit.returncode
        found[-1 - node_exit.node] = RankFailure(None, node_exit.node, None, exitcode=code)
    return sorted(found.values(), key=lambda f: (f.at is None, f.at or 0.0, f.node, f.rank or 0))


def only_symptoms(exits: list[NodeExit], errors: list[dict]) -> bool:
    """Whatever failed so far failed only because a peer went away (a connection it closed, the
    rendezvous store it hosted): that peer, dying or on its way out, has the evidence of the cause."""
    return any(e.failing for e in exits) and not rank_failures(exits, errors, symptoms=False)


@dataclass(frozen=True)
class PlainWindow:
    """How a plain script's non-zero exit is judged: within `startup_window_s` of the attempt's
    launch (`started_at`) it is the script's own mistake, after it a crash worth a retry."""

    started_at: float
    startup_window_s: float


def describe_failure(
    failure: RankFailure, status: AttemptStatus, plain: bool, window: PlainWindow | None = None
) -> tuple[Outcome, str]:
    """The outcome one failure implies, and a reason that quotes the evidence."""
    error, code = failure.error, failure.exitcode
    if error is not None:
        kind = exception_outcome(str(error.get("type")))
        return kind, (
            f"rank {error.get('rank')} raised {error.get('type')} at step {error.get('step')}: {error.get('message')}"
        )
    ranked = status.ranks.get(failure.rank) if failure.rank is not None else None
    at_step = f" at step {ranked.step}" if ranked is not None and status.first_step_at else ""
    # never the last stderr line as such: a script that logs to stderr and dies without a traceback
    # would be blamed on its latest log line (its tail is in the attempt's evidence)
    said = exception_line(failure.stderr_tail) or failure.error_line
    quoted = f": {said}" if said else ""
    if code == EXIT_ORCHESTRATOR_LOST:
        return Outcome.INFRA, f"{failure.who} lost the orchestrator"
    if code == STORE_UNREACHABLE:
        return Outcome.INFRA, f"{failure.who} could not restore the script's checkpoint from the store"
    if code is None:
        return Outcome.CRASHED, f"a worker on node {failure.node} died"
    if code < 0:
        if plain and -code == signal.SIGTERM:
            return Outcome.PREEMPTED, f"{failure.who} was stopped by SIGTERM (reclaimed){at_step}"
        kind = Outcome.KILLED if -code == signal.SIGKILL else Outcome.CRASHED  # SIGKILL: the OOM killer's
        subject = f"a worker on node {failure.node}" if failure.rank is None else failure.who
        return kind, f"{subject} was killed by {signal_name(-code)}{at_step}"  # its stderr: in the evidence
    if plain:
        if window is None:
            return Outcome.USER_ERROR, f"{failure.who} exited with code {code}{quoted}"
        after_s = max(0.0, (failure.at or time.time()) - window.started_at)
        if after_s <= window.startup_window_s:
            # still starting: a bad argument, a missing file, an import error -- the script's to fix
            return Outcome.USER_ERROR, (
                f"{failure.who} exited with code {code} {after_s:.0f}s after launch, within "
                f"fault_tolerance.plain_startup_window_s ({window.startup_window_s:g}s)"
                f"{quoted}"
            )
        return Outcome.CRASHED, f"{failure.who} exited with code {code} {after_s:.0f}s after launch{quoted}"
    if status.first_step_at is None:
        # nothing trained yet: a bad argument, a missing file, an import error -- the script's to fix
        return Outcome.USER_ERROR, f"{failure.who} exited with code {code} before its first step{quoted}"
    return Outcome.CRASHED, f"{failure.who} exited with code {code}{at_step}{quoted}"


def everyone_finished(status: AttemptStatus, world_size: int | None) -> bool:
    if status.finished is None:
        return False
    return world_size is None or len(status.finished_ranks) >= world_size


def stopped_by_sigterm(node_exit: NodeExit) -> bool:
    """The node's agent was stopped by SIGTERM (a preemption, scancel, the orchestrator) and no rank
    of it failed on its own."""
    code = node_exit.returncode
    return code in (-signal.SIGTERM, 128 + signal.SIGTERM) and all(
        r.exitcode in (0, -signal.SIGTERM) and not r.root_cause for r in node_exit.ranks
    )


def classify_exit(
    exits: list[NodeExit],
    status: AttemptStatus,
    world_size: int | None = None,
    plain: bool = False,
    window: PlainWindow | None = None,
) -> tuple[Outcome, str]:
    """The outcome of an attempt that ended because its processes exited.

    Decided from evidence that does not depend on the order processes go in: every rank's own
    finished or error report, and each failed rank's exit as its launcher recorded it. The first
    rank to fail is the cause; a rank that failed only because a peer went away is a symptom."""
    failed = [e for e in exits if e.failing]
    if not failed:
        if plain:
            return Outcome.SUCCEEDED, "every rank exited 0"
        if everyone_finished(status, world_size):
            assert status.finished is not None  # everyone_finished() has read it
            return Outcome.SUCCEEDED, f"finished at step {status.finished['step']}"
        return Outcome.USER_ERROR, "workers exited 0 without finishing (did the script call run.finish()?)"
    if not plain and everyone_finished(status, world_size) and all(stopped_by_sigterm(e) for e in failed):
        # the work is done and committed; a signal that came after it (a preemption, the time limit)
        # cut only the agents' exit short: a retry would have nothing to train
        nodes = ", ".join(str(e.node) for e in sorted(failed, key=lambda e: e.node))
        assert status.finished is not None  # everyone_finished() has read it
        return Outcome.SUCCEEDED, f"finished at step {status.finished['step']} (then SIGTERM stopped node(s) {nodes})"
    if status.diverged is not None:
        hashes = status.diverged.get("hashes")
        return Outcome.DIVERGED, f"replicas diverged at step {status.diverged.get('step')} (parameter hashes {hashes})"
    if status.preempted is not None:
        # a backend's evidence of who sent the SIGTERM (Slurm: the time limit's warning)
        hints = [getattr(e, "reason", "") for e in exits if getattr(e, "outcome", None) == Outcome.PREEMPTED]
        sender = next((hint for hint in hints if hint), "")
        return Outcome.PREEMPTED, (
            f"preempted (SIGTERM to rank {status.preempted.get('rank')}): emergency checkpoint at step "
            f"{status.preempted.get('step')} committed" + (f"; {sender}" if sender else "")
        )
    if plain and (stopped := [e.node for e in failed if stopped_by_sigterm(e)]):
        # a plain script has no emergency checkpoint: its node was reclaimed, and its peers' errors follow
        return Outcome.PREEMPTED, f"node {_nodes_named(stopped)} stopped by SIGTERM (reclaimed)"
    causes = rank_failures(exits, status.errors)
    reported = [f for f in causes if f.error is not None]
    if reported and reported[0] is causes[0]:
        return describe_failure(reported[0], status, plain, window)
    for node_exit in sorted(failed, key=lambda e: e.node):
        hinted = getattr(node_exit, "outcome", None)  # a backend's own evidence (a pod OOMKilled, evicted)
        if hinted is not None:
            return hinted, f"node {node_exit.node}: {getattr(node_exit, 'reason', '') or hinted.value}"
    if causes:
        return describe_failure(causes[0], status, plain, window)
    messages = [e.get("message", "") for e in status.errors]
    return Outcome.INFRA, f"communication failed between nodes: {(messages[0] if messages else '')[:300]}"


def _nodes_named(nodes: list[int]) -> str:
    return ", ".join(str(n) for n in sorted(nodes))


# ends that were no failure of the job: they never make a retry wait
NOT_FAILURES = frozenset({Outcome.PREEMPTED, Outcome.RESIZED})


@dataclass(frozen=True)
class Decision:
    retry: bool
    reason: str
    backoff_s: float = 0.0


def budget_for(outcome: Outcome, policy: FaultTolerance) -> tuple[str, int]:
    """Which budget an outcome draws on: preemptions, infrastructure and user errors have their own."""
    if outcome == Outcome.PREEMPTED:
        return "preemption", policy.max_preemptions
    if outcome == Outcome.INFRA:
        return "infrastructure", policy.max_infra_failures
    if outcome == Outcome.USER_ERROR:
        return "user-error", policy.max_user_errors
    return "restart", policy.max_restarts


def budget_used(name: str, policy: FaultTolerance, results: list[AttemptResult]) -> int:
    """Retries budget `name` has paid for: ended attempts and recoveries in place alike."""
    ended = sum(1 for r in results if budget_for(r.outcome, policy)[0] == name)
    in_place = sum(1 for r in results for restart in r.in_place if budget_for(restart.outcome, policy)[0] == name)
    return ended + in_place


def in_place_budget(policy: FaultTolerance, results: list[AttemptResult]) -> dict[str, int]:
    """The recoveries in place the next attempt may make, for each outcome a rank's exception (INFRA,
    USER_ERROR) or a rank process's death (CRASHED, KILLED, or HUNG: a frozen rank ended) can have:
    what that outcome's budget has left, where retry_on names it (fault_tolerance.in_process_restart)."""
    if not policy.in_process_restart:
        return {}
    left = {}
    for outcome in (Outcome.INFRA, Outcome.USER_ERROR, Outcome.CRASHED, Outcome.KILLED, Outcome.HUNG):
        if outcome in policy.retry_on:
            name, budget = budget_for(outcome, policy)
            left[outcome.value] = max(0, budget - budget_used(name, policy, results))
    return left


def decide(policy: FaultTolerance, results: list[AttemptResult]) -> Decision:
    """After an attempt ends: take the retry branch, or finish (succeeded or failed) and say why."""
    last = results[-1]
    if last.outcome == Outcome.SUCCEEDED:
        return Decision(False, last.reason)
    if last.outcome == Outcome.RESIZED:  # the orchestrator's own stop, at a committed checkpoint: no budget
        return Decision(True, f"{last.outcome.value}: {last.reason}")
    if last.outcome not in policy.retry_on:
        return Decision(False, f"{last.outcome.value} is not retried: {last.reason}")
    if last.evidence.tracking_store is not None:  # another attempt would train unrecorded too
        return Decision(False, f"{last.outcome.value} is not retried while the tracking store is down: {last.reason}")
    if len(results) >= 2 and last.outcome != Outcome.PREEMPTED:
        previous = results[-2]
        # a plain script reports no steps: the same failure from the same restored copy is the loop
        if (
            previous.outcome == last.outcome
            and previous.last_step == last.last_step
            and previous.resumed_from == last.resumed_from
        ):
            return Decision(
                False, f"crash loop: {last.outcome.value} twice at step {last.last_step}, stopping ({last.reason})"
            )
    name, budget = budget_for(last.outcome, policy)
    used = budget_used(name, policy, results)
    if used > budget:
        return Decision(False, f"{name} budget spent ({budget}): {last.outcome.value}: {last.reason}")
    backoff = 0.0
    retries = sum(1 for r in results if r.outcome not in NOT_FAILURES)
    # an isolated failure is retried at once; repeated ones back off; a reclaimed machine never waits
    if last.outcome != Outcome.PREEMPTED and retries > 1:
        backoff = min(policy.backoff_max_s, policy.backoff_s * 2 ** (retries - 2))
    return Decision(True, f"{last.outcome.value}: {last.reason}; {name} retry {used} of {budget}", backoff)
