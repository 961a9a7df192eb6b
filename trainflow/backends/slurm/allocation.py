"""What the Slurm backend holds for one run and for each attempt's batch job."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainflow.backends.base import Allocation, AttemptHandle
from trainflow.backends.netns import LostSlots
from trainflow.backends.slurm.commands import JobState
from trainflow.backends.slurm.links import ClusterLinks


@dataclass
class SlurmAllocation(Allocation):
    hosts: list[str] = field(default_factory=list)  # the partition's node names; a slot is an index here
    exclude: list[str] = field(default_factory=list)  # nodes left out of the next attempts (--exclude)
    jobs: list[str] = field(default_factory=list)  # every attempt's job id, cancelled at release
    partition: str | None = None
    links: ClusterLinks | None = None  # a cluster brought up on this machine: node links drills can cut
    lost: LostSlots = field(default_factory=LostSlots)  # node slots a drill took away for good


@dataclass
class SlurmAttempt(AttemptHandle):
    """An attempt's batch job: where its files are and what Slurm last said of it."""

    job_id: str = ""
    run_id: str = ""
    attempt_dir: Path = Path()
    hosts: list[str] = field(default_factory=list)  # the allocation's, shared: a node first seen is added
    warn_before_limit_s: int | None = None
    job: JobState | None = None  # the last answer from slurmctld
    asked_at: float = 0.0  # monotonic time of that answer
    node_names: list[str] = field(default_factory=list)  # the job's nodes, once it started
    signalled_at: float | None = None  # when trainflow itself signalled the job (not the time limit)
    limit_ends_at: float | None = None  # when the job's time limit ends, while it is active
