"""What a rank's exception means: the outcome it stands for, and whether it is only a symptom of a
peer's going away. Ranks recovering in place (runtime/in_place.py) and the orchestrator
(orchestrator/failures.py) read an exception alike."""

from __future__ import annotations

from trainflow.contracts.outcome import Outcome

INFRA_ERRORS = frozenset({"StorageError", "CheckpointInvalid", "ManifestError", "DistNetworkError", "DistStoreError"})

PEER_FAILURE_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker crashing",
    "Broken pipe",
    "NCCL communicator was aborted",
)


def exception_outcome(type_name: str) -> Outcome:
    """An exception of the infrastructure's (storage, rendezvous, network) is INFRA; any other
    exception of a script is the script's own: USER_ERROR."""
    return Outcome.INFRA if type_name in INFRA_ERRORS else Outcome.USER_ERROR


def is_peer_failure_message(message: str) -> bool:
    """An error a rank raised only because another rank went away: a symptom, not the cause."""
    return any(sign in message for sign in PEER_FAILURE_SIGNS)
