"""Prefect's temporary server for one `trainflow` command, owned by trainflow instead of Prefect.

Prefect starts its temporary server as a plain child process: Ctrl-C in the terminal reaches it
too (it dies before the flow's teardown has reported back), a SIGKILLed orchestrator leaves it
running (ppid 1, a listening port), and it must answer within 20 s, which a loaded host misses.
This one runs in a session of its own, dies with the process that started it (the kernel's
parent-death signal), may take as long as a slow host needs to start, and is stopped by its owner
once everything else is done.

Two commands starting at once on a new PREFECT_HOME would both set up its SQLite database, and one
of them fails on what the other made. Starting a server takes a file lock in PREFECT_HOME until it
answers, so the first sets the database up and the next starts on it. Both keep that one database
(not one each): it is where a person reopens the runs in the Prefect UI afterwards.

Run as `python -m trainflow.prefect.server PARENT_PID PORT` by `TemporaryServer.start()`.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainflow.backends.ports import free_port

STARTUP_TIMEOUT_S = 300  # a first start migrates a fresh SQLite database; a busy host takes minutes
STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"  # Prefect's own setting, honoured
STOP_GRACE_S = 10.0
PORT_ATTEMPTS = 3
PR_SET_PDEATHSIG = 1
SETUP_LOCK = ".trainflow-server-setup.lock"


class ServerError(RuntimeError):
    """The temporary server did not start."""


def startup_timeout_s() -> float:
    try:
        return float(os.environ.get(STARTUP_TIMEOUT_ENV) or STARTUP_TIMEOUT_S)
    except ValueError:
        return STARTUP_TIMEOUT_S


class TemporaryServer:
    """One temporary server: `start()`, use `api_url`, `stop()` when everything else is done."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.port = 0
        self._log = tempfile.TemporaryFile()  # gone with the file handle: nothing left on disk

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self, timeout_s: float) -> None:
        try:
            self._start(timeout_s)
        except BaseException:  # also Ctrl-C while it starts: never leave it running
            self.stop()
            raise

    def _start(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with _setup_lock(deadline, timeout_s):
            self._start_by(deadline, timeout_s)

    def _start_by(self, deadline: float, timeout_s: float) -> None:
        for _ in range(PORT_ATTEMPTS):
            self.port = free_port()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trainflow.prefect.server", str(os.getpid()), str(self.port)],
                env=_server_environment(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the terminal's Ctrl-C is for the orchestrator, which stops it last
            )
            if self._wait_healthy(deadline):
                return
            if self.process.poll() is None or "address already in use" not in self._log_tail():
                break  # another port only helps when this one was taken meanwhile
        raise ServerError(self._failure(timeout_s))

    def _wait_healthy(self, deadline: float) -> bool:
        process = self.process
        while process is not None and time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=5) as response:
                    if response.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def _failure(self, timeout_s: float) -> str:
        tail = " | ".join(line for line in self._log_tail().splitlines()[-3:] if line.strip())
        code = self.process.poll() if self.process is not None else None
        what = (
            f"exited with code {code} before it answered"
            if code is not None
            else f"did not answer within {timeout_s:g} s (raise {STARTUP_TIMEOUT_ENV}, or set PREFECT_API_URL "
            "to a running server)"
        )
        return f"the temporary Prefect server {what}" + (f": {tail}" if tail else "")

    def _log_tail(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-4000:].decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the grace period; waits until it is gone."""
        process, self.process = self.process, None
        if self._log.closed:
            return
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._log.close()


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


@contextmanager
def _setup_lock(deadline: float, timeout_s: float) -> Iterator[None]:
    """PREFECT_HOME's set-up lock, held until the server answers (waited for until `deadline`)."""
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / SETUP_LOCK, "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ServerError(
                        f"the temporary Prefect server did not start within {timeout_s:g} s: another "
                        f"command was setting up {home}'s database all that time (raise "
                        f"{STARTUP_TIMEOUT_ENV})"
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _server_environment() -> dict[str, str]:
    # what Prefect sets for its own temporary server: no UI, the ephemeral server's services only
    return {
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def _die_with(parent_pid: int) -> None:
    """End this process when `parent_pid` ends, however it ends (SIGKILL included)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except (OSError, AttributeError):  # not Linux: watch the parent instead
        threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(0)


def _exit_when_orphaned(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def serve(parent_pid: int, port: int) -> None:
    _die_with(parent_pid)
    import uvicorn

    uvicorn.run(
        "prefect.server.api.server:create_app",
        factory=True,
        host="127.0.0.1",
        port=port,
        log_level="error",
        lifespan="on",
    )


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
