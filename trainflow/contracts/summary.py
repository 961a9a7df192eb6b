"""The run summary: what `trainflow run --json` prints as its last line, what finalize logs as
summary.json and what the lifecycle flow returns. Its attempts and figures are the run ledger's."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from trainflow.contracts.ledger import AttemptFigures, RunFigures


class QuotaHeld(BaseModel):
    """The team quota a run held from before provision to after teardown."""

    limit: str  # the Prefect global concurrency limit, trainflow-team-<team>
    devices: int
    waited_s: float  # queued for it


class CheckpointRow(BaseModel):
    step: int
    uri: str
    verified: bool
    committed_at: float | None = None


class Resize(BaseModel):
    """The job changed size between two attempts: a lost node left out (after NODE_LOST, or a rule's
    exclude_node), or a left-out node back (after RESIZED)."""

    attempt: int  # the first attempt at the new size
    from_world_size: int
    to_world_size: int
    after: str  # the previous attempt's outcome
    resumed_from_step: int  # the checkpoint step the new size resharded from


def resizes_of(attempts: list[AttemptFigures]) -> list[Resize]:
    return [
        Resize(
            attempt=now.attempt,
            from_world_size=before.world_size,
            to_world_size=now.world_size,
            after=before.outcome.value,
            resumed_from_step=now.resumed_from_step,
        )
        for before, now in zip(attempts, attempts[1:])
        if now.world_size != before.world_size
    ]


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: str  # succeeded or failed (a refused rerun never reaches a summary)
    reason: str
    run_id: str
    mlflow_run_id: str
    tracking_uri: str
    experiment: str
    prefect_flow_run_id: str
    final_step: int
    total_steps: int
    final_loss: float | None  # the mean over ranks of their loss at the final step
    params_sha256: str | None
    checkpoints: list[CheckpointRow]
    snapshots_failed: list[int]
    attempts: list[AttemptFigures]
    resizes: list[Resize] = []
    stragglers: list[dict[str, Any]]
    goodput: float | None
    features_off: list[str]
    costs: RunFigures
    diagnosis: list[str]
    plots: list[str] = []
    # set after finalize: by teardown, by a faulted (drill) run, by a rerun
    teardown: dict[str, Any] | None = None
    quota: QuotaHeld | None = None
    faults: list[dict[str, Any]] | None = None
    rerun_of: str | None = None
    drift: list[str] | None = None
    original_params_sha256: str | None = None

    @property
    def steps_reported(self) -> bool:
        """Whether the ranks reported their steps; a plain script's ranks (no trainflow.runtime) do not."""
        return "progress" not in self.features_off

    def at_step(self) -> str:
        """' at step N' for a run whose steps were reported, else nothing."""
        return f" at step {self.final_step}" if self.steps_reported else ""

    def as_json_dict(self) -> dict[str, Any]:
        """The `--json` object: the fields that were set, JSON-typed (outcomes as their names; a
        value JSON has no type for, in a backend's teardown report, as its text)."""
        return self.model_dump(mode="json", exclude_unset=True, fallback=str)
