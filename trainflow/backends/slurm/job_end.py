"""What a node's end was, from its agent's exit file or, where it could not write one, from the job's
end at Slurm; and whether a SIGTERM was the time limit's warning."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

from trainflow.backends.base import NodeExit
from trainflow.backends.slurm import commands
from trainflow.backends.slurm.allocation import SlurmAttempt
from trainflow.backends.slurm.commands import JobState, SlurmError
from trainflow.backends.slurm.node_agent import read_signal
from trainflow.contracts import Outcome

# Slurm checks time limits periodically and may send --signal's warning up to 60 s early
WARNING_EARLY_S = 65.0

# what a job's own end says when no node agent could report (the node or the job was taken away)
JOB_END_OUTCOMES = {
    "NODE_FAIL": Outcome.NODE_LOST,
    "PREEMPTED": Outcome.PREEMPTED,
    "TIMEOUT": Outcome.PREEMPTED,
    "OUT_OF_MEMORY": Outcome.KILLED,
    "BOOT_FAIL": Outcome.INFRA,
    "DEADLINE": Outcome.PREEMPTED,
}


@dataclass(frozen=True)
class SlurmNodeExit(NodeExit):
    """A node's exit with Slurm's evidence: the job's state and reason, and the outcome they imply."""

    outcome: Outcome | None = None
    reason: str = ""


def read_exit(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def time_limit_warning(handle: SlurmAttempt, node: int) -> str | None:
    """Slurm's evidence that a node's SIGTERM was the time limit's warning (--signal=TERM@N): the
    spec asked for one, trainflow sent no signal itself, and it came within the warning's window
    before the limit Slurm set for the job."""
    received = read_signal(handle.attempt_dir, node)
    warn, ends_at = handle.warn_before_limit_s, handle.limit_ends_at
    if received is None or received[0] != "TERM" or not warn or ends_at is None or handle.signalled_at:
        return None
    before = ends_at - received[1]
    if not 0 <= before <= warn + WARNING_EARLY_S:
        return None
    limit = handle.job.time_limit if handle.job else "?"
    return (
        f"slurm job {handle.job_id}: the time limit's warning, SIGTERM {before:.0f}s before its "
        f"{limit} limit (--signal=TERM@{warn})"
    )


def from_job(job: JobState | None) -> tuple[int, Outcome | None, str]:
    """A node's exit when its agent could not say: from the job's end at Slurm."""
    if job is None:
        return -signal.SIGKILL, Outcome.INFRA, "the job is no longer known to Slurm"
    reason = f"slurm job {job.job_id} {job.state} (reason {job.reason}, exit code {job.exit_code}:{job.exit_signal})"
    code = -job.exit_signal if job.exit_signal else (job.exit_code or -signal.SIGKILL)
    return code, JOB_END_OUTCOMES.get(job.state), reason


def wait_inactive(jobs: list[str], timeout_s: float) -> dict[str, str]:
    """Wait until none of `jobs` is active; returns those still active at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        active = {}
        for job_id in jobs:
            try:
                state = commands.job_state(job_id)
            except SlurmError as exc:
                active[job_id] = f"unknown ({exc})"
                continue
            if state is not None and state.active:
                active[job_id] = state.state
        if not active or time.monotonic() > deadline:
            return active
        time.sleep(0.3)
