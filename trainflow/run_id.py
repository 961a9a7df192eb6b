"""A run's id: the name of its scratch folder, its MLflow tag and every one of its processes' job
marker. The flow makes one, or takes the one its caller chose ahead."""

from __future__ import annotations

import re
import time
import uuid

from trainflow.home import runs_root

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def new_run_id(spec) -> str:
    return f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"


def checked_run_id(run_id: str) -> str:
    """A run id given to the flow: a name for a scratch folder, and none an earlier run has used."""
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(f"run_id: {run_id!r} is not a run id (letters, digits, '.', '_', '-'; at most 128)")
    if (runs_root() / run_id).exists():
        raise ValueError(f"run_id: {run_id!r} is in use (its scratch folder {runs_root() / run_id} exists)")
    return run_id
