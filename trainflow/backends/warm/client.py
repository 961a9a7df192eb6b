"""The requesting side of a zygote's channel: fork requests, and Popen-like handles on the forked
processes (pid, poll, wait, send_signal), for the launcher (agents) and the agent (ranks)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
import time

import psutil

from trainflow.backends.warm.protocol import ChannelClosed, NotForkable, receive_message, send_message

_PUMP_S = 0.05


class ZygoteChannel:
    """One channel to a zygote; safe to use from several threads."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._lock = threading.Lock()
        self._next_request = 1
        self._replies: dict[int, dict] = {}
        self._exits: dict[int, int] = {}  # pid -> exit status, as Popen.returncode
        self.workers: dict[int, list[int]] = {}  # agent pid -> the ranks forked for it
        self.ready: dict | None = None  # the zygote's account of its imports, once it is ready
        self.closed = False

    def fork(
        self, role: str, argv: list[str], env: dict[str, str], cwd: str, stdio: list[int], timeout_s: float = 30.0
    ) -> ForkedProcess:
        """A forked process running this command; NotForkable where the zygote cannot."""
        return self._request({"op": "fork", "role": role, "argv": argv, "env": env, "cwd": cwd}, stdio, argv, timeout_s)

    def clone(self, log_fd: int, timeout_s: float = 30.0) -> tuple[ZygoteChannel, ForkedProcess]:
        """A zygote forked from this one, its imports done, serving on a channel of its own and
        writing to `log_fd`; NotForkable where this zygote cannot."""
        ours, theirs = socket.socketpair()
        try:
            process = self._request({"op": "clone"}, [theirs.fileno(), log_fd], ["trainflow-zygote-clone"], timeout_s)
        except NotForkable:
            ours.close()
            raise
        finally:
            theirs.close()
        return ZygoteChannel(ours), process

    def _request(self, message: dict, fds: list[int], argv: list[str], timeout_s: float) -> ForkedProcess:
        with self._lock:
            request = self._next_request
            self._next_request += 1
            try:
                send_message(self.sock, {**message, "id": request}, fds)
            except OSError as exc:
                self.closed = True
                raise NotForkable(f"the zygote is gone ({exc})") from None
        deadline = time.monotonic() + timeout_s
        while (reply := self._replies.pop(request, None)) is None:
            if self.closed or time.monotonic() > deadline:
                raise NotForkable("the zygote did not answer")
            self.pump(_PUMP_S)
        if reply["op"] != "started":
            raise NotForkable(reply.get("error", "refused"))
        return ForkedProcess(self, reply["pid"], argv)

    def wait_ready(self, timeout_s: float) -> dict | None:
        """The zygote's ready message (its imports done), or None if it is unfit, gone or late."""
        deadline = time.monotonic() + timeout_s
        while self.ready is None and not self.closed and time.monotonic() < deadline:
            self.pump(min(0.2, max(0.0, deadline - time.monotonic())))
        return self.ready if self.ready and self.ready.get("op") == "ready" else None

    def pump(self, timeout_s: float) -> None:
        """Take in the messages that have arrived, waiting up to timeout_s for the first."""
        with self._lock:
            wait_s = timeout_s
            while not self.closed:
                readable, _, _ = select.select([self.sock], [], [], wait_s)
                if not readable:
                    return
                try:
                    message, fds = receive_message(self.sock)
                except (ChannelClosed, OSError):
                    self.closed = True
                    return
                for fd in fds:
                    os.close(fd)
                self._note(message)
                wait_s = 0

    def exit_status(self, pid: int) -> int | None:
        return self._exits.get(pid)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self.sock.close()

    def _note(self, message: dict) -> None:
        op = message.get("op")
        if op in ("started", "refused"):
            self._replies[message["id"]] = message
        elif op == "exited":
            self._exits[message["pid"]] = message["returncode"]
        elif op == "worker":
            self.workers.setdefault(message["agent"], []).append(message["pid"])
        elif op in ("ready", "unfit"):
            self.ready = message


class ForkedProcess:
    """A process a zygote forked, handled like a subprocess.Popen."""

    def __init__(self, channel: ZygoteChannel, pid: int, args: list[str]):
        self.channel = channel
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.channel.pump(0)
            self.returncode = self.channel.exit_status(self.pid)
            if self.returncode is None and self.channel.closed and not psutil.pid_exists(self.pid):
                self.returncode = -signal.SIGKILL  # its zygote is gone, and so is it: status unknown
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            if self.channel.closed:
                time.sleep(_PUMP_S)
            else:
                self.channel.pump(_PUMP_S if deadline is None else min(_PUMP_S, max(0.0, deadline - time.monotonic())))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    @property
    def forked_workers(self) -> list[int]:
        """The ranks the zygote forked for this process (an agent)."""
        return list(self.channel.workers.get(self.pid, []))
