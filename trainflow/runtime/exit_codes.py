"""The worker's exit codes, under the runtime's own name (defined in trainflow/exit_codes.py)."""

from trainflow.exit_codes import DIVERGED, ORCHESTRATOR_LOST, PREEMPTED

__all__ = ["DIVERGED", "ORCHESTRATOR_LOST", "PREEMPTED"]
