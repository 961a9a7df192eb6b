"""The contracts between trainflow's parts: outcome kinds, attempt results, the run ledger every
figure comes from, and the run summary that is `trainflow run --json`.

A leaf: it imports nothing else of trainflow, so every part can depend on it.

The ledger, the recovery phases and the run summary are pydantic models: they are loaded on first
use, since workers import this package for its stdlib parts (exit codes, outcomes, attempt results)
and the training runtime imports no pydantic.
"""

from importlib import import_module
from typing import Any

from trainflow.contracts.attempt import AttemptResult, WorkerMilestones
from trainflow.contracts.outcome import RETRYABLE, Outcome

_PYDANTIC_MODELS = {
    "AttemptFigures": "ledger",
    "RunFigures": "ledger",
    "RunLedger": "ledger",
    "run_ledger": "ledger",
    "RecoveryPhases": "recovery",
    "recovery_phases": "recovery",
    "CheckpointRow": "summary",
    "RunSummary": "summary",
}

__all__ = [
    "RETRYABLE",
    "AttemptFigures",
    "AttemptResult",
    "CheckpointRow",
    "Outcome",
    "RecoveryPhases",
    "RunFigures",
    "RunLedger",
    "RunSummary",
    "WorkerMilestones",
    "recovery_phases",
    "run_ledger",
]


def __getattr__(name: str) -> Any:
    module = _PYDANTIC_MODELS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
