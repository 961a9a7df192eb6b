"""In-process restart: after an exception in a rank's script, every rank goes back to its in-memory
copy of the same step in the process it already has, and the script runs again (spec:
fault_tolerance.in_process_restart, runtime scripts only). A rank process that died, or was ended
frozen, is replaced by its node's agent (backends/rank_replacement.py): the new process takes the
dead one's copies over from the node's shared memory and joins the same round (`join_as_replacement`).

    a rank raises ──▶ it breaks its process groups off ──▶ its peers' collectives raise at once
    (a rank dies ──▶ its sockets close with it ──▶ the same; its agent starts one in its place)
    every rank: report to the round (the job's store) ──▶ rank 0 decides for all
        go:     new process group (a new store prefix) ──▶ the script runs again in the same process
                (for the first time in a replacement); init() joins that group, restore() loads the
                in-memory copy ──▶ training goes on
        no go:  the exception ends the rank as before, a replacement ends by its predecessor's signal
                (the attempt ends, the orchestrator decides, as without in-process restart)

The decision is the orchestrator's rules, taken where the ranks are (in_place_rules.py): the cause
is a rank process's death, or else the earliest rank whose exception is not only a symptom of
another's; its outcome (INFRA, USER_ERROR, CRASHED, KILLED, HUNG) must be retried by the spec and
have budget left, which the orchestrator handed down at launch (WorkerConfig.in_place_budget) and
counts again after the attempt; the same failure at the same step from the same copy twice is a
crash loop. A rank that does not report within the collective timeout (its process died and was
not replaced, or it is stuck) means no go: the attempt ends as it always did, and a SIGTERM
meanwhile (its node's agent or the orchestrator stopping the attempt) ends the wait. Rank 0 counts
the rounds in the store, so a replacement knows the round and the decisions before it.

Imports, the interpreter and the process stay; the script's objects are built again by its own
code (models, optimizers, loaders), and their state comes from the memory copy, not from storage.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from trainflow.contracts import status_protocol as wire
from trainflow.contracts.exceptions import is_peer_failure_message
from trainflow.runtime.group_sockets import break_off_groups
from trainflow.runtime.in_place_rules import Report, RoundDecision, decide_round
from trainflow.runtime.memory_copy import MemoryCopies
from trainflow.worker_config import GAVE_UP, rank_copies_folder

if TYPE_CHECKING:
    from trainflow.runtime import Run

ROUND_KEY = "trainflow/in-place"
# a checkpoint save in flight ends before the groups are broken off; one still running after this is
# stuck in a collective, and its process cannot go on cleanly: the round is no go (a full restart)
SAVE_ENDS_WITHIN_S = 10.0


@dataclass
class Pending:
    """A round that went ahead: what the next init() and restore() of the script finish."""

    round: int
    decision: RoundDecision
    failed_at: float
    abort_s: float
    began: float  # perf_counter at the failure
    copy_every: int  # the memory copies' cadence when it failed
    replaced: bool = False  # this process was started in place of the rank's that died
    replace_s: float = 0.0  # from that death to this process's report to the round


@dataclass
class Carried:
    """What outlives one run of the script in this process."""

    reporter: Any  # the rank's StatusReporter: one connection for the process
    store: Any  # the job's store, under the groups' prefixes
    copies: MemoryCopies = field(default_factory=MemoryCopies)
    decisions: list[RoundDecision] = field(default_factory=list)
    pending: Pending | None = None
    announce: dict | None = None  # the round's report, sent once the first step after it is done


_carried: Carried | None = None
_active: Run | None = None


def enabled(config) -> bool:
    return any(left > 0 for left in config.in_place_budget.values())


def pending() -> Pending | None:
    return _carried.pending if _carried is not None else None


def carried() -> Carried | None:
    return _carried


def attach(run: Run, store: Any) -> None:
    """`run` is the script's run now; `store` is the job's store (kept from the first init). The
    copies go to the rank's folder in its node's shared memory, where there is one: a process
    started in place of this one, should it die, goes on from them (`join_as_replacement`)."""
    global _carried, _active
    if _carried is None:
        _carried = Carried(reporter=run.reporter, store=store, copies=MemoryCopies(rank_copies_folder(run.rank)))
    _active = run


def new_group_store(round_: int) -> Any:
    return dist.PrefixStore(f"{ROUND_KEY}/{round_}/group", _carried.store)


def recover(exc: BaseException) -> bool:
    """Called with the exception that ends the script's run: True when every rank goes back to its
    memory copy and the script must run again, False when the exception ends the rank as before."""
    global _active
    run, held = _active, _carried
    if run is None or held is None or isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return False
    if not enabled(run.config) or not held.copies.steps:
        return False
    began, failed_at = time.perf_counter(), time.time()
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)  # the node log has it whole
    _active = None
    shut, save_ended = run.abandon(break_off_groups, SAVE_ENDS_WITHIN_S)
    abort_s = time.perf_counter() - began
    round_ = next_round(held.store)
    line = _line(exc)
    print(
        f"trainflow: rank {run.rank} raised {type(exc).__name__} at step {run.step}: {line}; "
        f"{shut} connection(s) of its process groups shut; recovering in place (round {round_})",
        file=sys.stderr,
        flush=True,
    )
    mine = Report(
        rank=run.rank,
        type=type(exc).__name__,
        message=line,
        step=run.step,
        copies=held.copies.steps,
        t=failed_at,
        blocked=None if save_ended else f"rank {run.rank}'s checkpoint save did not end with its groups",
    )
    copy_every = run._control.memory_every
    stopped = lambda: run._control.preempt_requested_at is not None  # noqa: E731 - the SIGTERM flag
    decision = _agree(held.store, round_, run.rank, run.world_size, run.config, mine, stopped)
    if not decision.go:
        print(f"trainflow: no recovery in place: {decision.reason}", file=sys.stderr, flush=True)
        return False
    held.decisions.append(decision)
    held.pending = Pending(round_, decision, failed_at, abort_s, began, copy_every)
    return True


def restore(run: Run) -> int:
    """In restore(): load the copy the round chose into the script's new objects; returns the step
    to go on after. The round is reported once the first step after it is done (`first_step_done`):
    its recovery runs from the failure to that step, as a restart's does to its first step."""
    held = _carried
    assert held is not None and held.pending is not None and run._state is not None
    pending_round, held.pending = held.pending, None
    rejoined = time.perf_counter()
    restore_s = held.copies.restore(pending_round.decision.restored_step, run._state)
    decision = pending_round.decision
    held.announce = {
        "round": pending_round.round,
        "outcome": decision.outcome,
        "reason": decision.reason,
        "cause_rank": decision.cause_rank,
        "failed_step": decision.failed_step,
        "restored_step": decision.restored_step,
        "failed_at": pending_round.failed_at,
        "abort_s": pending_round.abort_s,
        "rejoin_s": max(0.0, rejoined - pending_round.began - pending_round.abort_s),
        "restore_s": restore_s,
        "copy_every_steps": pending_round.copy_every,
        "replaced": pending_round.replaced,
        "replace_s": pending_round.replace_s,
    }
    print(
        f"trainflow: rank {run.rank} back at step {decision.restored_step} from its memory copy "
        f"(round {pending_round.round}, {time.perf_counter() - pending_round.began:.2f}s after the failure)",
        file=sys.stderr,
        flush=True,
    )
    return decision.restored_step


def first_step_done(reporter: Any) -> None:
    """After a step: report the round this run of the script recovered from, if it has not been."""
    held = _carried
    if held is not None and held.announce is not None:
        reporter.send(wire.RestartedInPlace(**held.announce))
        held.announce = None


class Stopped(Exception):
    """A SIGTERM reached the rank while it waited in the round: its attempt is being stopped."""


def join_as_replacement(rank: int, world_size: int, config: Any, reporter: Any, died: dict) -> Pending:
    """In a rank process started in place of one that died (backends/rank_replacement.py), before
    its process group: report the death to the round its peers are in, and take the dead one's
    copies over from the node's shared memory. Returns the round to go on with; a round that is no
    go ends this process as the dead one ended, by its signal, marked so as not to be replaced again."""
    global _carried
    began, t = time.perf_counter(), time.time()
    store = _job_store(config.collective_timeout_s)
    folder = rank_copies_folder(rank)
    copies = MemoryCopies.left_in(folder) if folder is not None else MemoryCopies()
    round_ = next_round(store)
    earlier = [_decided(store, number) for number in range(1, round_)]
    _carried = Carried(reporter=reporter, store=store, copies=copies, decisions=[d for d in earlier if d.go])
    mine = Report(
        rank=rank,
        type=died["signal"],
        message=(
            f"was ended frozen ({died['hung']}; process {died['pids'][-1]})"
            if died.get("hung")
            else f"was killed by {died['signal']} (process {died['pids'][-1]})"
        ),
        step=-1,
        copies=copies.steps,
        t=died["t"],
        outcome=died["outcome"],
    )
    print(
        f"trainflow: rank {rank} starts in place of process {died['pids'][-1]}, killed by {died['signal']}, "
        f"{max(0.0, t - died['t']):.2f}s after, with its in-memory copies of step(s) {copies.steps or 'none'}; "
        f"joining round {round_}",
        file=sys.stderr,
        flush=True,
    )
    decision = _agree(store, round_, rank, world_size, config, mine, lambda: False)
    if not decision.go:
        print(f"trainflow: no recovery in place: {decision.reason}", file=sys.stderr, flush=True)
        if folder is not None:
            (folder / GAVE_UP).touch()
        _end_as(died["exitcode"])
    _carried.decisions.append(decision)
    since_death = max(0.0, t - died["t"])
    _carried.pending = Pending(
        round_, decision, died["t"], 0.0, began - since_death, 0, replaced=True, replace_s=since_death
    )
    return _carried.pending


def job_store(default_group_store: Any) -> Any:
    """The store the rounds are agreed in: the job's store (torchrun's) under init_process_group's
    prefix, as the first default group of every rank process saw it, without that group's own
    prefix (its name counts the groups a process made). A process started in place of another
    reaches the same through `_job_store`."""
    return default_group_store.underlying_store


def _job_store(timeout_s: float) -> Any:
    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    return dist.PrefixStore("default_pg", store)  # as init_process_group wraps it


def _end_as(exitcode: int) -> None:
    """End this process by the signal that ended the one before it: the attempt's outcome is the
    same as if it had never been replaced."""
    sys.stdout.flush()
    sys.stderr.flush()
    number = -exitcode if exitcode < 0 else signal.SIGKILL
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    os._exit(128 + number)  # a signal that does not end a process by default (not one replaced)


def next_round(store: Any) -> int:
    """The number of the round a failure now starts: rank 0 counts them in the job's store, so a
    process started in place of another's knows it as well as the ranks that were there."""
    key = f"{ROUND_KEY}/next-round"
    return int(store.get(key)) if store.check([key]) else 1


def _decided(store: Any, round_: int) -> RoundDecision:
    return RoundDecision.from_dict(json.loads(store.get(f"{ROUND_KEY}/{round_}/decision")))


def _agree(
    store: Any, round_: int, rank: int, world_size: int, config: Any, mine: Report, stopped: Callable[[], bool]
) -> RoundDecision:
    """Every rank reports; rank 0 waits for all, reads what decides and decides; the others read its
    decision. Every rank, rank 0 too, makes a constant number of store requests.

    The waits come back to Python every WAIT_SLICE_S: a rank that died never reports, and its node's
    agent, or the orchestrator stopping the attempt, sends the others a SIGTERM, which must end
    them now rather than at the end of the wait (the agent kills a worker 30 s after its SIGTERM)."""
    key = f"{ROUND_KEY}/{round_}"
    wait_s = config.collective_timeout_s
    try:
        report_to_round(store, key, mine, world_size)
        if rank == 0:
            wait = lambda names: wait_for(store, names, wait_s, stopped)  # noqa: E731
            decision = decide_for_all(
                store, key, world_size, mine.copies, config.in_place_budget, _carried.decisions, wait
            )
            store.set(f"{ROUND_KEY}/next-round", str(round_ + 1))  # before the decision: see next_round
            store.set(f"{key}/decision", json.dumps(decision.as_dict()))
            return decision
        wait_for(store, [f"{key}/decision"], 2 * wait_s, stopped)  # rank 0 waits for the reports first
        return _decided(store, round_)
    except Stopped:
        return RoundDecision.no_go("the attempt is being stopped (SIGTERM)")
    except (RuntimeError, ValueError, OSError) as exc:  # the store is gone, or the wait ran out
        return RoundDecision.no_go(f"the round could not be agreed on: {type(exc).__name__}: {str(exc)[:200]}")


WAIT_SLICE_S = 0.1


def wait_for(store: Any, names: list[str], seconds: float, stopped: Callable[[], bool]) -> None:
    """`store.wait(names)` for up to `seconds`, in slices: between them a pending signal's handler
    runs, and `stopped()` ends the wait (Stopped). Past `seconds` the store's own timeout error."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait(names, timedelta(seconds=max(0.001, min(WAIT_SLICE_S, left))))
            return
        except (RuntimeError, ValueError):  # the slice ran out (DistStoreError is a RuntimeError)
            if stopped():
                raise Stopped from None
            if left <= WAIT_SLICE_S:
                raise


def report_to_round(store: Any, key: str, mine: Report, world_size: int) -> None:
    """One rank's word, folded where it can be: a count of the ranks holding each copy, the first of
    the symptoms (a peer's going away); a cause is written whole. Its arrival goes last: the last
    rank to arrive says that all have."""
    for step in mine.copies:
        store.add(f"{key}/holding/{step}", 1)
    if mine.blocked and store.add(f"{key}/blocked", 1) == 1:
        store.set(f"{key}/first-blocked", mine.blocked)
    if is_peer_failure_message(mine.message):
        if store.add(f"{key}/symptoms", 1) == 1:
            store.set(f"{key}/first-symptom", json.dumps(mine.as_dict()))
    else:
        store.set(f"{key}/cause/{store.add(f'{key}/causes', 1)}", json.dumps(mine.as_dict()))
    store.set(f"{key}/arrived/{mine.rank}", "1")  # read only to name the ranks missing
    if store.add(f"{key}/arrived", 1) == world_size:
        store.set(f"{key}/all-arrived", "1")


def decide_for_all(
    store: Any,
    key: str,
    world_size: int,
    own_copies: list[int],
    budget: dict[str, int],
    earlier: list[RoundDecision],
    wait: Callable[[list[str]], None],
) -> RoundDecision:
    """Rank 0: wait until every rank has reported under `key` (`wait(names)` raises when they have not
    in time), read the causes and the counts of the copies rank 0 holds (a step every rank holds is
    one of them), decide."""
    try:
        wait([f"{key}/all-arrived"])
    except (RuntimeError, ValueError) as exc:
        missing = [r for r in range(world_size) if not store.check([f"{key}/arrived/{r}"])]
        shown = ", ".join(str(r) for r in missing[:10]) + (" ..." if len(missing) > 10 else "")
        return RoundDecision.no_go(f"rank(s) {shown} did not report in time ({str(exc)[:200]})")
    count = int(store.add(f"{key}/causes", 0))
    causes = [f"{key}/cause/{i}" for i in range(1, count + 1)]
    reports = [Report.from_dict(json.loads(value)) for value in (store.multi_get(causes) if causes else [])]
    symptom = f"{key}/first-symptom"
    first_symptom = Report.from_dict(json.loads(store.get(symptom))) if store.check([symptom]) else None
    holding = {step: int(store.add(f"{key}/holding/{step}", 0)) for step in own_copies}
    blocked = store.get(f"{key}/first-blocked").decode() if int(store.add(f"{key}/blocked", 0)) else None
    return decide_round(reports, first_symptom, holding, world_size, budget, earlier, blocked)


def _line(exc: BaseException) -> str:
    """The exception's message as an Error report carries it (its first line)."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:500]


def forget_script_objects(exc: BaseException) -> None:
    """The failed run's objects (its model, its optimizer) go before the script runs again."""
    tb = exc.__traceback__
    if tb is not None:
        traceback.clear_frames(tb)
    exc.__traceback__ = None
    gc.collect()
