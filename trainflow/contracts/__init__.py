"""The contracts between trainflow's parts: outcome kinds, attempt results, the run ledger every
figure comes from, and the run summary that is `trainflow run --json`.

A leaf: it imports nothing else of trainflow, so every part can depend on it.
"""

from trainflow.contracts.attempt import AttemptResult, WorkerMilestones
from trainflow.contracts.ledger import AttemptFigures, RunFigures, RunLedger, run_ledger
from trainflow.contracts.outcome import RETRYABLE, Outcome
from trainflow.contracts.recovery import RecoveryPhases, recovery_phases
from trainflow.contracts.summary import CheckpointRow, RunSummary

__all__ = [
    "RETRYABLE", "AttemptFigures", "AttemptResult", "CheckpointRow", "Outcome", "RecoveryPhases", "RunFigures",
    "RunLedger", "RunSummary", "WorkerMilestones", "recovery_phases", "run_ledger",
]
