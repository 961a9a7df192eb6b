"""Shared by every test: the project root, and no child process outliving the session."""

from __future__ import annotations

from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def pytest_sessionfinish(session, exitstatus) -> None:
    """Every fixture has been torn down by now. A child still running was left by a test that
    failed half-way; multiprocessing would wait for it at exit and the session would never end.
    Name it and end it (multiprocessing's own resource tracker ends with pytest)."""
    leftovers = [p for p in psutil.Process().children(recursive=True) if not _resource_tracker(p)]
    for process in leftovers:
        try:
            print(f"\ntrainflow tests: ending a leftover process {process.pid}: {' '.join(process.cmdline())[:200]}")
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(leftovers, timeout=10)


def _resource_tracker(process: psutil.Process) -> bool:
    try:
        return "resource_tracker" in " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return True
