"""Slurm's own commands, called as a user on a login node would, and their parsable output read into
plain records. No PySlurm (it does not build against 22.05) and no sacct (it needs slurmdbd)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime

NEEDED = ("sbatch", "squeue", "scontrol", "scancel", "srun", "sinfo")
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
}
NODE_TROUBLE = ("DOWN", "NOT_RESPONDING", "FAIL", "DRAIN", "NO_RESPOND")


class SlurmError(RuntimeError):
    """A Slurm command failed; the message has its error output."""


def missing_commands() -> list[str]:
    return [c for c in NEEDED if not shutil.which(c)]


def slurm(*args: str, timeout_s: float = 30.0, env: dict[str, str] | None = None) -> str:
    try:
        result = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{args[0]}: no answer within {timeout_s:.0f}s") from None
    if result.returncode != 0:
        raise SlurmError(f"{' '.join(args[:2])}: {(result.stderr or result.stdout).strip()[-1000:]}")
    return result.stdout


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, PREEMPTED, TIMEOUT, ...
    reason: str
    nodelist: str
    exit_code: int | None = None  # the batch script's, once ended
    exit_signal: int | None = None
    time_limit: str = ""  # as scontrol says: 00:01:00, UNLIMITED
    end_time: float | None = None  # while running: when the time limit ends it; once ended: when it ended

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def started(self) -> bool:
        return self.state not in {"PENDING", "CONFIGURING"} and bool(self.nodelist) and self.nodelist != "(null)"


def parse_key_values(line: str) -> dict[str, str]:
    """`scontrol show -o` output: `Key=value Key2=value2 ...` on one line."""
    fields = {}
    for item in line.split():
        key, sep, value = item.partition("=")
        if sep:
            fields[key] = value
    return fields


def job_state(job_id: str) -> JobState | None:
    """The job as the controller knows it (finished jobs are kept for MinJobAge); None once forgotten."""
    try:
        out = slurm("scontrol", "show", "job", "-o", job_id)
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    fields = parse_key_values(out.strip().splitlines()[0]) if out.strip() else {}
    if not fields:
        return None
    code, _, sig = fields.get("ExitCode", "").partition(":")
    state = fields.get("JobState", "UNKNOWN")
    ended = state not in ACTIVE_STATES
    return JobState(
        job_id=job_id,
        state=state,
        reason=fields.get("Reason", "None"),
        nodelist=fields.get("NodeList", ""),
        exit_code=int(code) if ended and code.isdigit() else None,
        exit_signal=int(sig) if ended and sig.isdigit() else None,
        time_limit=fields.get("TimeLimit", ""),
        end_time=_timestamp(fields.get("EndTime", "")),
    )


def _timestamp(text: str) -> float | None:
    """A time as scontrol prints it (local time, 2026-12-01T11:34:05), or None (Unknown, None)."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def expand_hostlist(nodelist: str) -> list[str]:
    """node[0-2],gpu5 -> [node0, node1, node2, gpu5], in Slurm's order (node 0 of a job first)."""
    if not nodelist or nodelist == "(null)":
        return []
    return slurm("scontrol", "show", "hostnames", nodelist).split()


def node_state(name: str) -> dict[str, str]:
    """State, reason and address of one node, as `scontrol show node` says."""
    try:
        out = slurm("scontrol", "show", "node", "-o", name, timeout_s=10)
    except SlurmError as exc:
        return {"State": "UNKNOWN", "Reason": str(exc)}
    fields = parse_key_values(out.strip())
    return {k: fields.get(k, "") for k in ("State", "Reason", "NodeAddr")}


def partition_nodes(partition: str | None) -> dict[str, str]:
    """Every node of the partition (the default one when None) with its state."""
    args = ["sinfo", "--noheader", "--Node", "--format=%N|%T"]
    if partition:
        args.append(f"--partition={partition}")
    nodes = {}
    for line in slurm(*args).splitlines():
        name, _, state = line.strip().partition("|")
        if name:
            nodes[name] = state.upper()
    return nodes


def usable(state: str) -> bool:
    return not any(sign in state.upper() for sign in NODE_TROUBLE) and not state.endswith("*")


def controller_address() -> str | None:
    """slurmctld's address, from `scontrol show config` (SlurmctldHost[0] = name(addr) or name)."""
    for line in slurm("scontrol", "show", "config").splitlines():
        key, _, value = line.partition("=")
        if key.strip().startswith("SlurmctldHost[0]"):
            value = value.strip()
            if "(" in value:
                return value.split("(", 1)[1].rstrip(")")
            return value or None
    return None


def environment_with(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra}
