"""In a node's agent, with in-process restart: a rank process that died is replaced, alone, while
the node's other ranks go on (runtime/in_place.py brings the new one into their round).

torchrun's agent ends every rank of the node when one fails (its process context closes them all in
the same poll that finds the failure), and the attempt ends with it. Here the agent's poll first
looks for a rank that died by a signal (a crash, a kill: not a stop, and not an exit the script or
a round chose), whose state a copy in the node's shared memory holds (backends/shared_copies.py),
and whose outcome has budget left (a rank the orchestrator ended says why in the node's rank
records first: found frozen, it is a hang, not a kill; ended for the attempt to end, a drill's
corrupt checkpoint, it is not replaced): it starts one process in its place, with the same command and
environment, from the node's warm standby where there is one, and torchrun goes on watching the new
one. The new process learns what became of the one before it from REPLACES_ENV.

A rank that is not replaced fails as before: torchrun stops the node and reports it. A replacement
that could not rejoin (the round was no go) ends as its predecessor ended, by the same signal, and
leaves a mark in its folder so that it is not replaced again: the attempt ends as it would have
without in-process restart, with the same outcome."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from trainflow.backends import rank_records
from trainflow.worker_config import GAVE_UP, MEMORY_COPIES_ENV, REPLACES_ENV

STOPPING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})  # an agent's or a user's stop
REPLACED_OUTCOMES = ("CRASHED", "KILLED", "HUNG")  # HUNG: a frozen rank the orchestrator ended


def outcome_of(exitcode: int) -> str | None:
    """What a rank's death stands for, as the orchestrator reads it (orchestrator/failures.py); None
    for an exit that is not a death by a signal, or a stop."""
    if exitcode >= 0 or -exitcode in STOPPING:
        return None
    return "KILLED" if -exitcode == signal.SIGKILL else "CRASHED"


def signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


class Replacer:
    """The agent's replacements for one attempt: at most `budget[outcome]` of each outcome."""

    def __init__(self, budget: dict[str, int], folder: Path, records: str | None):
        self.budget = dict(budget)
        self.folder = folder
        self.records = records
        self.replaced: dict[int, list[int]] = {}  # global rank -> the pids it has had, oldest first

    def check(self, pcontext, worker_group) -> None:
        """Replace each rank of the node that died in a way it can come back from."""
        for local_rank in sorted(getattr(pcontext, "_running_local_ranks", ())):
            handler = pcontext.subprocess_handlers[local_rank]
            exitcode = getattr(handler.proc, "peek", handler.proc.poll)()  # not yet recorded as exited
            outcome = None if exitcode is None else outcome_of(exitcode)
            if outcome is None:
                continue
            ended = rank_records.read_ended(Path(self.records)).get(handler.proc.pid) if self.records else None
            hung = ended[0] if ended and ended[1] else None
            if hung is not None:  # the orchestrator ended it frozen (watcher.py): the hang is the cause
                outcome = "HUNG"
            worker = worker_group.workers[local_rank]
            why_not = f"the orchestrator ended it: {ended[0]}" if ended and not ended[1] else None
            why_not = why_not or self._why_not(worker.global_rank, outcome)
            if why_not:  # torchrun goes on as it would have: the node's other ranks stopped, a failure
                print(
                    f"trainflow: rank {worker.global_rank} (process {handler.proc.pid}) was killed by "
                    f"{signal_name(exitcode)} and is not replaced in place: {why_not}",
                    flush=True,
                )
                continue
            self.budget[outcome] -= 1
            self._replace(pcontext, worker, local_rank, handler, exitcode, outcome, hung)

    def _why_not(self, rank: int, outcome: str) -> str | None:
        rank_dir = self.folder / f"rank-{rank}"
        if (rank_dir / GAVE_UP).exists():
            return "the round its last replacement joined was no go"
        if self.budget.get(outcome, 0) <= 0:
            return f"{outcome} has no recovery in place left in its budget"
        if not any(rank_dir.glob("slot-*.json")):
            return "it died before its first in-memory copy"
        return None

    def _replace(
        self, pcontext, worker, local_rank: int, handler, exitcode: int, outcome: str, hung: str | None
    ) -> None:
        from torch.distributed.elastic.multiprocessing import api

        pids = self.replaced.setdefault(worker.global_rank, [])
        pids.append(handler.proc.pid)
        died = {
            "rank": worker.global_rank,
            "pids": pids,
            "exitcode": exitcode,
            "signal": signal_name(exitcode),
            "outcome": outcome,
            "hung": hung,  # why the orchestrator ended it, if it ended it frozen
            "t": time.time(),
        }
        if self.records:
            rank_records.note_replaced(self.records, handler.proc.pid, local_rank, exitcode)
        for stream in (getattr(handler, "_stdout", None), getattr(handler, "_stderr", None)):
            if stream is not None:
                stream.close()
        replacement = api.get_subprocess_handler(
            entrypoint=pcontext.entrypoint,
            args=pcontext.args[local_rank],
            env={**pcontext.envs[local_rank], REPLACES_ENV: json.dumps(died)},
            stdout=pcontext.stdouts[local_rank],
            stderr=pcontext.stderrs[local_rank],
            local_rank_id=local_rank,
            numa_options=getattr(pcontext, "_numa_options", None),
        )
        pcontext.subprocess_handlers[local_rank] = replacement
        worker.id = replacement.proc.pid  # torchrun checks its workers' pids against the context's
        print(
            f"trainflow: rank {worker.global_rank} (process {handler.proc.pid}) was killed by "
            f"{died['signal']}; process {replacement.proc.pid} started in its place",
            flush=True,
        )


def install_from_environment(budget: dict[str, int]) -> Replacer | None:
    """In the agent, before torchrun starts (after rank_records.install_from_environment): replace
    dead ranks where in-process restart may."""
    budget = {outcome: left for outcome, left in budget.items() if outcome in REPLACED_OUTCOMES and left > 0}
    folder = os.environ.get(MEMORY_COPIES_ENV)
    if not budget or not folder:
        return None
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    replacer = Replacer(budget, Path(folder), rank_records.installed_path)
    monitor = LocalElasticAgent._monitor_workers

    def monitor_replacing(self, worker_group):
        if self._pcontext is not None:
            replacer.check(self._pcontext, worker_group)
        return monitor(self, worker_group)

    LocalElasticAgent._monitor_workers = monitor_replacing
    return replacer
