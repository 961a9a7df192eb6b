"""The spec's `fault_tolerance:` section: how failures are detected, classified and retried."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from trainflow.contracts import RETRYABLE, Outcome
from trainflow.runspec.retry_rules import RetryRule
from trainflow.section import Section

DEFAULT_RETRY_ON: list[Outcome] = [o for o in RETRYABLE if o != Outcome.USER_ERROR]


class FaultTolerance(Section):
    """How failures are detected, classified and retried."""

    max_restarts: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3,
        title="Max restarts",
        description="Retries after crashes, kills, hangs, lost nodes and divergence before the run fails.",
    )
    max_preemptions: Annotated[int, Field(ge=0, le=1000)] = Field(
        default=10, title="Max preemptions", description="Separate budget of retries after preemptions."
    )
    max_infra_failures: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3, title="Max infrastructure failures", description="Separate budget after rendezvous/storage failures."
    )
    max_user_errors: Annotated[int, Field(ge=0, le=100)] = Field(
        default=0, title="Max user errors", description="Retries after an exception in the training code or a NaN loss."
    )
    retry_on: list[Outcome] = Field(
        default_factory=lambda: list(DEFAULT_RETRY_ON),
        title="Retry on",
        description="Outcomes that take the retry branch (USER_ERROR also needs max_user_errors > 0).",
    )
    rules: list[RetryRule] = Field(
        default_factory=list,
        title="Rules",
        description="Checked in order before the built-in classification and its defaults (out of memory: "
        "stop; a port already in use or a failed rendezvous: INFRA): the first rule whose exit code, signal "
        "or log pattern matches the earliest failing rank (the cause) sets the outcome or the action (retry, stop, "
        "exclude_node).",
    )
    in_process_restart: bool = Field(
        default=False,
        title="In-process restart",
        description="Runtime scripts: after an exception in a rank's script, a rank process's death (a crash, "
        "a kill) or a frozen rank, the healthy ranks go back to their in-memory copy of the same step "
        "(checkpoint.memory_every_steps) in the processes they have, and a dead or frozen rank's process is "
        "replaced by one that takes its copies over, within the budget and retry_on the failure's outcome "
        "would draw on; a lost node or a preemption still ends the attempt.",
    )
    backoff_s: Annotated[float, Field(ge=0, le=3600)] = Field(
        default=1.0,
        title="Backoff (s)",
        description="Wait before the second retry, doubling after; the first retry and preemptions never wait.",
    )
    backoff_max_s: Annotated[float, Field(ge=0, le=3600)] = Field(
        default=60.0, title="Longest backoff (s)", description="The wait between retries doubles up to this."
    )
    heartbeat_interval_s: Annotated[float, Field(gt=0, le=60)] = Field(
        default=1.0,
        title="Heartbeat interval (s)",
        description="How often each node tells the orchestrator it is alive; under half the heartbeat timeout.",
    )
    heartbeat_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=10.0, title="Heartbeat timeout (s)", description="A node silent this long is lost."
    )
    hang_timeout_s: Annotated[float, Field(gt=0, le=86400)] | None = Field(
        default=None,
        title="Hang timeout (s)",
        description="No step progress this long is a hang (default: 20 x the slowest step, at least 30 s).",
    )
    startup_timeout_s: Annotated[float, Field(gt=0, le=86400)] = Field(
        default=600.0,
        title="Start-up timeout (s)",
        description="From launch to every rank's first step (imports, data, rendezvous, restore); past it "
        "the attempt is HUNG, with stacks. Plain scripts are not limited.",
    )
    plain_startup_window_s: Annotated[float, Field(ge=0, le=86400)] = Field(
        default=60.0,
        title="Plain start-up window (s)",
        description="Plain scripts: a non-zero exit within this many seconds of launch is USER_ERROR (a bad "
        "argument, a missing file, an import error); after it, CRASHED and retried within max_restarts.",
    )
    exit_timeout_s: Annotated[float, Field(gt=0, le=86400)] = Field(
        default=300.0,
        title="Exit timeout (s)",
        description="Once one node's ranks have all exited 0, the other nodes' ranks must exit within this "
        "(torchrun's exit barrier waits as long); past it the attempt is HUNG, with the stacks of the ranks "
        "still running.",
    )
    preemption_grace_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=30.0,
        title="Preemption grace (s)",
        description="Time from SIGTERM to SIGKILL: the emergency checkpoint must fit.",
    )
    orchestrator_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=30.0,
        title="Orchestrator timeout (s)",
        description="Workers stop when the orchestrator has been unreachable this long.",
    )
    straggler_factor: Annotated[float, Field(gt=1, le=100)] = Field(
        default=1.5,
        title="Straggler factor",
        description="Compute time above this multiple of the other ranks' median...",
    )
    straggler_steps: Annotated[int, Field(ge=1, le=10000)] = Field(
        default=5, title="Straggler steps", description="...for this many reports in a row marks a straggler."
    )
    divergence_check_every_steps: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        default=50, title="Divergence check every N steps", description="Compare replicas' parameter hashes (0: never)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> FaultTolerance:
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must be more than twice heartbeat_interval_s")
        if self.backoff_max_s < self.backoff_s:
            raise ValueError("backoff_max_s must be at least backoff_s")
        if len(set(self.retry_on)) != len(self.retry_on):
            raise ValueError("retry_on lists an outcome twice")
        if not_failures := [o.value for o in self.retry_on if o not in RETRYABLE]:
            raise ValueError(f"retry_on lists {', '.join(not_failures)}, which is not a failure")
        if Outcome.USER_ERROR in self.retry_on and self.max_user_errors == 0:
            raise ValueError("retry_on includes USER_ERROR but max_user_errors is 0")
        return self
