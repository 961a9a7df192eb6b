"""Finding and ending every process of a job, however deep its tree.

Each node's launcher starts in its own session and every process of the job carries the job's
marker in its environment, so survivors are found even if something escaped its session.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from trainflow.worker_config import JOB_ENV


def job_processes(run_id: str) -> list[psutil.Process]:
    """Live processes whose environment marks them as part of this job."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(JOB_ENV) == run_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def signal_session(session_id: int, sig: int) -> None:
    try:
        os.killpg(session_id, sig)  # a session leader's pid is also its process group id
    except (ProcessLookupError, PermissionError):
        pass


def terminate(processes: list[psutil.Process], grace_s: float) -> int:
    """SIGTERM, wait up to `grace_s`, then SIGKILL what is left; returns how many were ended."""
    alive = []
    for proc in processes:
        try:
            proc.send_signal(signal.SIGTERM)
            alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=5)
    return len(processes)


def wait_until_gone(run_id: str, timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while True:
        survivors = job_processes(run_id)
        if not survivors or time.monotonic() > deadline:
            return survivors
        time.sleep(0.1)


def describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid} ({' '.join(proc.cmdline()[:4])})"
    except psutil.Error:
        return f"pid {proc.pid}"
