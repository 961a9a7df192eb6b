"""A helper process that uploads a rank's checkpoint files, so the transfer's threads never compete
with training for the GIL.

boto3's transfer manager runs its parts in Python threads; inside a training process they take the
GIL from the training loop for as long as an upload lasts (measured: steps 20-30 % slower while a
snapshot uploads, none with the upload in its own process). Each rank therefore hands its uploads
to one long-lived child process over a pipe — JSON lines, one request and one reply at a time.
The child runs at its parent thread's CPU priority (the background save's), inherits the
environment (endpoint, credentials, the job's marker for teardown) and exits when asked to, when
the pipe closes, or when its rank is gone, so it never outlives its rank. The last matters where a
rank is killed while the agent waits on an unreachable endpoint, or while a fork of the rank still
holds the pipe: an orphaned agent would live on, and a scheduler that tracks a job's processes by
their ancestry (Slurm's proctrack/linuxproc) no longer counts it as the job's.

The agent is started from the background save's thread while the training thread may be forking
(a DataLoader starting its workers). A process forked while Popen runs inherits the pipes Popen has
open, among them the one Popen reads until its child has exec'd, and keeps them as long as it lives:
Popen then waits for that DataLoader worker, not for the agent, and the save never finishes. So forks
wait while an agent is being started. A fork later still inherits the rank's ends of the agent's
pipes, which is why the agent is told to exit rather than left to see the end of its input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainflow.checkpoint.storage import StorageError

_STARTING = threading.Lock()  # held while an agent is started; os.fork() waits for it
os.register_at_fork(before=_STARTING.acquire, after_in_parent=_STARTING.release, after_in_child=_STARTING.release)


class TransferAgent:
    """Storage-like uploads through the helper process; started on first use."""

    def __init__(self, uri: str):
        self.uri = uri
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def upload_many(self, pairs: list[tuple[Path, str]]) -> None:
        self._call({"op": "upload", "pairs": [[str(path), key] for path, key in pairs]})

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                proc.stdin.close()
            except OSError:
                pass  # it has exited already
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _call(self, request: dict) -> None:
        with self._lock:
            proc = self._start()
            try:
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
            except OSError:
                line = ""
            if not line:
                self._proc = None
                proc.kill()
                proc.wait()
                raise StorageError(f"{self.uri}: the upload helper process exited (code {proc.returncode})")
        reply = json.loads(line)
        if not reply["ok"]:
            raise StorageError(reply["error"])

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            with _STARTING:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "trainflow.checkpoint.transfer_agent", self.uri, str(os.getpid())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    bufsize=1,
                )
        return self._proc


PARENT_CHECK_S = 0.5


def exit_when_orphaned(parent: int) -> None:
    """End this process as soon as `parent` is no longer its parent, whatever the main thread is doing."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve(uri: str, parent: int) -> None:
    """The agent's loop: one JSON request per line on stdin, one JSON reply per line on stdout."""
    from trainflow.checkpoint.storage import open_storage

    exit_when_orphaned(parent)
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # whatever a library prints must not end up in the replies
    storage = open_storage(uri)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "exit":
            return
        try:
            if request["op"] == "upload":
                storage.upload_many([(Path(path), key) for path, key in request["pairs"]])
            else:
                raise StorageError(f"unknown request {request['op']!r}")
            reply = {"ok": True}
        except StorageError as exc:
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:  # anything else still gets an answer, never a hung pipe
            reply = {"ok": False, "error": f"{uri}: {type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
