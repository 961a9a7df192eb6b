"""The job's own temporary folder on this machine: every process of a local run gets it as TMPDIR,
so what they leave in it when they are stopped (a DataLoader's multiprocessing folders and sockets,
a library's temporary files) goes with the run's teardown, or with the reaper of a dead orchestrator.

It lies in the system's temporary folder under a short name: a Unix socket's path may not exceed
108 bytes, and multiprocessing makes its listener sockets in TMPDIR."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path


def job_temp_dir(run_id: str) -> Path:
    return Path(tempfile.gettempdir()) / f"trainflow-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}"
