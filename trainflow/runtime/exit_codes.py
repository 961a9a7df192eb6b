"""The worker's exit codes, under the runtime's own name (defined in trainflow/contracts/exit_codes.py)."""

from trainflow.contracts.exit_codes import DIVERGED, ORCHESTRATOR_LOST, PREEMPTED

__all__ = ["DIVERGED", "ORCHESTRATOR_LOST", "PREEMPTED"]
