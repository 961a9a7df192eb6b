"""How an attempt ended: the one outcome kind the watcher, the retry policy, the summary and the
pictures all speak."""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    SUCCEEDED = "SUCCEEDED"
    CRASHED = "CRASHED"
    KILLED = "KILLED"
    HUNG = "HUNG"
    NODE_LOST = "NODE_LOST"
    PREEMPTED = "PREEMPTED"
    DIVERGED = "DIVERGED"
    USER_ERROR = "USER_ERROR"
    INFRA = "INFRA"
    CANCELLED = "CANCELLED"
    RESIZED = "RESIZED"  # stopped by the orchestrator at a committed checkpoint to change the job's size


# what a retry policy can name: an attempt that failed for a reason worth another try
RETRYABLE = tuple(o for o in Outcome if o not in (Outcome.SUCCEEDED, Outcome.CANCELLED, Outcome.RESIZED))
