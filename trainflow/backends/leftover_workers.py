"""No worker outlives its agent.

torchrun ends its workers in a `finally` (SIGTERM, then SIGKILL after 30 s). A signal that arrives
during that wait (Slurm signals every process of a step, a preemption sends SIGTERM) raises out of
it, and the agent would exit with workers still running: orphans that nobody stops. A scheduler that
finds a step's processes by their parent (Slurm's proctrack/linuxproc) cannot find them any more,
and a rank whose exit deadlocks in gloo lives for good. So before the agent exits, whatever is still
running under it is asked to stop, given the same grace, and killed."""

from __future__ import annotations

import signal

import psutil

WORKER_GRACE_S = 30.0  # torchrun's own wait between SIGTERM and SIGKILL


def end_leftover_workers(grace_s: float = WORKER_GRACE_S) -> list[str]:
    """SIGTERM every live process under this one, wait up to `grace_s`, SIGKILL the rest; returns
    those that had to be killed, described. Further SIGTERM and SIGINT are ignored meanwhile: this
    process is already on its way out."""
    left = _live_descendants()
    if not left:
        return []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    for proc in left:
        _send(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(left, timeout=grace_s)
    stubborn = {proc.pid: proc for proc in [*alive, *_live_descendants()]}  # and what they started meanwhile
    described = {pid: _describe(proc) for pid, proc in stubborn.items()}
    killed = [described[pid] for pid, proc in stubborn.items() if _send(proc, signal.SIGKILL)]
    psutil.wait_procs(list(stubborn.values()), timeout=5.0)
    return killed


def _live_descendants() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _send(proc: psutil.Process, sig: signal.Signals) -> bool:
    try:
        proc.send_signal(sig)
        return True
    except psutil.Error:
        return False


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid} ({' '.join(proc.cmdline())[:200]})"
    except psutil.Error:
        return f"pid {proc.pid}"
