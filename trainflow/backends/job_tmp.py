"""The job's own temporary folder on this machine: every process of a local run gets it as TMPDIR,
so what they leave in it when they are stopped (a DataLoader's multiprocessing folders and sockets,
a library's temporary files) goes with the run's teardown, or with the reaper of a dead orchestrator.

It lies in the system's temporary folder under a short name: a Unix socket's path may not exceed
108 bytes, and multiprocessing makes its listener sockets in TMPDIR. The name is random and the
folder new (0700), made by `mkdtemp`: in a folder every user can write to, a name that follows from
the run id could be made first by another user, who would then own what the workers put in it.
Where it is, is recorded in the run's scratch folder (private), where teardown and the reaper read it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from trainflow.private_files import write_private

RECORD = "job-tmp"
PREFIX = "trainflow-"


def create_job_temp_dir(scratch: Path) -> Path:
    """A new temporary folder for the run whose scratch folder is `scratch`, recorded there."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    write_private(scratch / RECORD, str(path))
    return path


def job_temp_dir(scratch: Path) -> Path | None:
    """The temporary folder recorded in `scratch`, or None; only ever a `trainflow-*` folder
    directly in the system's temporary folder."""
    try:
        path = Path((scratch / RECORD).read_text().strip())
    except OSError:
        return None
    if path.parent != Path(tempfile.gettempdir()) or not path.name.startswith(PREFIX):
        return None
    return path


def remove_job_temp_dir(scratch: Path) -> Path | None:
    """Remove the temporary folder recorded in `scratch` (before `scratch` itself goes)."""
    path = job_temp_dir(scratch)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
    return path
