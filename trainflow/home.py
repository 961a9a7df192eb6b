"""The one folder that holds all local state of the embedded default: MLflow, checkpoints, logs."""

from __future__ import annotations

import os
from pathlib import Path

from trainflow.checkpoint.location import is_remote


def trainflow_home() -> Path:
    """`TRAINFLOW_HOME`, or `.trainflow/` in the current directory when it is unset."""
    return Path(os.environ.get("TRAINFLOW_HOME") or ".trainflow").resolve()


def default_tracking_uri() -> str:
    return f"sqlite:///{trainflow_home() / 'mlflow.db'}"


def artifacts_root() -> Path:
    return trainflow_home() / "mlartifacts"


def runs_root() -> Path:
    """Per-run scratch space: logs, node-local checkpoint tiers, worker configs."""
    return trainflow_home() / "runs"


def resolve_checkpoint_uri(uri: str) -> str:
    """A remote store's URI stays as it is; relative local paths live under the home folder."""
    if is_remote(uri):
        return uri
    if uri.startswith("file://"):
        uri = uri.removeprefix("file://")
    path = Path(uri).expanduser()
    return str(path if path.is_absolute() else trainflow_home() / path)
