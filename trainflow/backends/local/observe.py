"""How the local backend's nodes look from outside: agents' workers, sessions, frozen or gone
processes, and every rank's Python stacks."""

from __future__ import annotations

import os

import psutil

from trainflow.backends.base import AttemptHandle
from trainflow.backends.rank_records import read_ranks
from trainflow.backends.stacks import py_spy_dump


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def agent_workers(agent, recursive: bool = False) -> list[psutil.Process]:
    """An agent's ranks (and with `recursive` their own children): the agent's children, or the
    processes its node's zygote forked for it (warm workers)."""
    forked = getattr(agent, "forked_workers", None)
    try:
        if forked is None:
            return psutil.Process(agent.pid).children(recursive=recursive)
    except psutil.Error:
        return []
    ranks = _processes(forked)  # a rank that died is left out, not the node's other ranks with it
    return ranks + [c for rank in ranks for c in _children(rank)] if recursive else ranks


def _processes(pids) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


def _stopped(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def node_workers(handle: AttemptHandle, node: int, agent) -> list[psutil.Process]:
    """The node's worker processes once its agent has started all of them (none before), remembered
    on the handle so a worker that dies is still known."""
    known = handle.workers.get(node, [])
    if len(known) < handle.procs_per_node:
        known = [c for c in agent_workers(agent) if alive(c)]
        handle.workers[node] = known
    return known if len(known) == handle.procs_per_node else []


def session_members(sessions: list[int]) -> list[psutil.Process]:
    """Every process in one of these sessions."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) in sessions:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def node_state(handle: AttemptHandle, node: int) -> str:
    """How a silent node looks from this machine: its processes stopped, running, or gone."""
    agent = handle.processes.get(node)
    if agent is None or agent.poll() is not None:
        return "gone"
    try:
        leader = psutil.Process(agent.pid)
        workers = agent_workers(agent, recursive=True)
        # a rank process started in place of one that died (rank_replacement.py), as its agent records it
        seen = {w.pid for w in workers}
        records = handle.rank_records.get(node)
        workers += _processes(pid for pid in (read_ranks(records) if records else {}).values() if pid not in seen)
        if leader.status() == psutil.STATUS_STOPPED:
            return "node-stopped"
        if any(_stopped(w) for w in workers):  # one that has just died is not the node gone
            return "workers-stopped"
    except psutil.Error:
        return "gone"
    return "running"


def rank_stacks(pids_by_rank: dict[int, int]) -> dict[int, str]:
    """Every rank's Python stacks, read from outside with py-spy (works on frozen processes)."""
    return {rank: py_spy_dump(pid) for rank, pid in sorted(pids_by_rank.items())}
