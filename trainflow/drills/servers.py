"""Local helper servers (moto's S3 endpoint, a Prefect server) started for benchmarks and tests:
wait until they answer over HTTP, and stop their whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path


class ServerError(RuntimeError):
    """A helper server exited early or did not answer in time."""


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float, log: Path | None = None) -> None:
    """Until `url` answers; fails as soon as the server has exited (with its log's tail, if kept)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"{url}: server exited early (code {proc.returncode}){_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise ServerError(f"{url}: not up after {timeout_s:.0f}s{_tail(log)}")


def stop_server(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM to the server's process group, SIGKILL after `grace_s`."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def _tail(log: Path | None) -> str:
    return f":\n{log.read_text()[-3000:]}" if log is not None and log.exists() else ""
