"""A node's zygote: `python -m trainflow.backends.warm.zygote --channel-fd FD [--preload MODULE ...]`.

It imports what every agent and rank needs, says it is ready on its channel, then waits. Each fork
request gets a child process that becomes the request's command (child.py); the requester hears the
child's pid at once and its exit status when it ends. An agent it forks gets a channel of its own,
on which the agent asks for its ranks.

The channel to the launcher ending (the orchestrator is gone, or the run is released) or a SIGTERM
ends every child with SIGTERM, as a parent-death signal would, and the zygote leaves once they are
gone. An agent's channel ending (the agent is gone) ends that agent's ranks.

A clone request gets a child that becomes a zygote of its own, on the channel and log the request
hands over, with every import already done: one import for all the node slots of a host.

For a job that replaces dead ranks in place it keeps one spare rank process (spare.py), forked
ahead once it has forked such a rank; the next rank it is asked for is that spare."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from trainflow.backends.warm.child import AGENT, CHILD_SIGNALS, WORKER, Command, NotForkable, become, run
from trainflow.backends.warm.protocol import ChannelClosed, receive_message, send_message
from trainflow.backends.warm.spare import SPARE, wait_as_spare, wants_a_spare


@dataclass
class Channel:
    sock: socket.socket
    agent_pid: int | None = None  # None: the launcher's channel


@dataclass
class Child:
    channel: Channel
    request: int
    role: str


@dataclass
class Spare:
    pid: int
    channel: socket.socket  # the zygote's end: the command it is to become goes down it


@dataclass
class Clone:
    """What a cloned zygote serves on: its own channel and log."""

    channel_fd: int
    log_fd: int

    @classmethod
    def parse(cls, fds: list[int]) -> Clone:
        if len(fds) != 2:
            raise NotForkable("a clone needs a channel and a log")
        return cls(*fds)


ZYGOTE = "zygote"  # a clone's role among the children


class Zygote:
    def __init__(self, control: socket.socket, stop_grace_s: float):
        self.control = Channel(control)
        self.channels = {control.fileno(): self.control}
        self.children: dict[int, Child] = {}
        self.spare: Spare | None = None
        self.stop_grace_s = stop_grace_s
        self.ending_at: float | None = None
        self.selector = selectors.DefaultSelector()
        self.wakeup_read, wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_read, False)
        os.set_blocking(wakeup_write, False)
        self._wakeup_write = wakeup_write
        signal.set_wakeup_fd(wakeup_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.end())
        self.selector.register(self.wakeup_read, selectors.EVENT_READ)
        self.selector.register(control, selectors.EVENT_READ)

    def serve(self) -> Command | Clone | None:
        """Serve until the end; in a forked child, return what that child must run or serve."""
        while True:
            self._reap()
            if self.ending_at is not None:
                if not self.children:
                    return None
                if time.monotonic() > self.ending_at + self.stop_grace_s:
                    self._signal_all(signal.SIGKILL)
            # idle until a request or a child's end wakes it; while ending, it checks the grace period
            for key, _ in self.selector.select(timeout=None if self.ending_at is None else 0.5):
                if key.fileobj == self.wakeup_read:
                    _drain(self.wakeup_read)
                    continue
                channel = self.channels.get(key.fileobj.fileno())
                if channel is None:
                    continue
                try:
                    message, fds = receive_message(channel.sock)
                except (ChannelClosed, OSError):
                    self._closed(channel)
                    continue
                command = self._fork(channel, message, fds)
                if command is not None:
                    return command

    def end(self) -> None:
        if self.ending_at is None:
            self.ending_at = time.monotonic()
            self._drop_spare()
            self._signal_all(signal.SIGTERM)

    def _fork(self, channel: Channel, message: dict, fds: list[int]) -> Command | Clone | None:
        request, op = message.get("id", 0), message.get("op")
        try:
            if op not in ("fork", "clone") or (op == "clone" and channel is not self.control):
                raise NotForkable(f"unknown request {op!r}")
            if self.ending_at is not None:
                raise NotForkable("the zygote is ending")
            command = Command.parse(message) if op == "fork" else Clone.parse(fds)
        except (NotForkable, KeyError, TypeError) as exc:
            _close_all(fds)
            self._send(channel, {"op": "refused", "id": request, "error": str(exc)})
            return None
        role = command.role if isinstance(command, Command) else ZYGOTE
        spare_kept = isinstance(command, Command) and wants_a_spare(command)
        if spare_kept and self._hand_to_spare(channel, request, message, fds):
            return self._make_spare()
        agent_end = None
        if role == AGENT:
            agent_end, child_end = socket.socketpair()
        in_session, session_made = os.pipe()
        # until the child has its own handlers, a signal must not run the zygote's in it
        signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_SIGNALS)
        pid = os.fork()
        if pid == 0:
            os.setsid()  # before its pid is handed out: whoever gets it may signal its group at once
            os.close(session_made)
            os.close(in_session)
            channel_fd = None
            if agent_end is not None:
                agent_end.close()
                channel_fd = child_end.detach()
            self._leave_to_child()
            if isinstance(command, Command):
                become(command, fds, channel_fd)  # ends by unblocking CHILD_SIGNALS
            return command  # a clone unblocks them once it has handlers of its own
        signal.pthread_sigmask(signal.SIG_UNBLOCK, CHILD_SIGNALS)
        os.close(session_made)
        os.read(in_session, 1)  # returns once the child has its session (or has died)
        os.close(in_session)
        _close_all(fds)
        if agent_end is not None:
            child_end.close()
            agent = Channel(agent_end, agent_pid=pid)
            self.channels[agent_end.fileno()] = agent
            self.selector.register(agent_end, selectors.EVENT_READ)
        self._started(channel, request, pid, role)
        return self._make_spare() if spare_kept else None

    def _started(self, channel: Channel, request: int, pid: int, role: str) -> None:
        """`pid` is the requested process: its requester hears so, and for an agent's rank the launcher."""
        self.children[pid] = Child(channel, request, role)
        self._send(channel, {"op": "started", "id": request, "pid": pid})
        if role == WORKER and channel.agent_pid is not None:
            self._send(self.control, {"op": "worker", "agent": channel.agent_pid, "pid": pid})

    def _hand_to_spare(self, channel: Channel, request: int, message: dict, fds: list[int]) -> bool:
        """The spare becomes the requested rank; False where there is none (or it has just died)."""
        spare, self.spare = self.spare, None
        if spare is None:
            return False
        try:
            send_message(spare.channel, message, fds)
        except OSError:
            _signal_session(spare.pid, signal.SIGKILL)
            return False
        finally:
            spare.channel.close()
        _close_all(fds)
        self._started(channel, request, spare.pid, WORKER)
        return True

    def _make_spare(self) -> Command | None:
        """Fork the next spare (none while ending, or while one waits). In the spare, once it is
        handed one, the command it becomes (os._exit where the zygote had no use for it)."""
        if self.spare is not None or self.ending_at is not None:
            return None
        ours, theirs = socket.socketpair()
        signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_SIGNALS)
        pid = os.fork()
        if pid == 0:
            os.setsid()
            ours.close()
            self._leave_to_child()
            handed = wait_as_spare(theirs)
            if handed is None:
                os._exit(0)
            command, fds = handed
            become(command, fds, None)
            return command
        signal.pthread_sigmask(signal.SIG_UNBLOCK, CHILD_SIGNALS)
        theirs.close()
        self.spare = Spare(pid, ours)
        self.children[pid] = Child(self.control, 0, SPARE)
        return None

    def _drop_spare(self) -> None:
        if self.spare is not None:
            self.spare.channel.close()  # it leaves on its own; the SIGTERM to every child is for one still importing
            self.spare = None

    def _leave_to_child(self) -> None:
        """The child keeps nothing of the zygote's: its channels, its wake-up pipe, its handlers."""
        self.selector.close()
        if self.spare is not None:
            self.spare.channel.close()
        for channel in self.channels.values():
            channel.sock.close()
        os.close(self.wakeup_read)
        os.close(self._wakeup_write)

    def _closed(self, channel: Channel) -> None:
        self.selector.unregister(channel.sock)
        del self.channels[channel.sock.fileno()]
        channel.sock.close()
        if channel is self.control:
            self.end()
            return
        for pid, child in list(self.children.items()):  # the agent is gone: so are its ranks
            if child.channel is channel:
                _signal_session(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None and child.role == SPARE:
                if self.spare is not None and self.spare.pid == pid:
                    self._drop_spare()  # died waiting: the next such rank is forked, and a new spare after it
            elif child is not None:
                self._send(
                    child.channel,
                    {"op": "exited", "id": child.request, "pid": pid, "returncode": os.waitstatus_to_exitcode(status)},
                )

    def _send(self, channel: Channel, message: dict) -> None:
        if channel.sock.fileno() < 0:
            return
        try:
            send_message(channel.sock, message)
        except OSError:
            pass  # a requester that has gone; its channel's end is handled when it is read

    def _signal_all(self, sig: signal.Signals) -> None:
        for pid in self.children:
            _signal_session(pid, sig)


def _signal_session(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # every child leads a session (and group) of its own
    except (ProcessLookupError, PermissionError):
        pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def preload(modules: list[str]) -> tuple[list[str], dict[str, str], str | None]:
    """Import each module; stop at one that leaves a thread running (forking would then be unsafe)."""
    imported, failed = [], {}
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # a module's own failure is the script's to report, cold
            failed[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            continue
        imported.append(name)
        if threading.active_count() > 1:
            return imported, failed, f"importing {name} started a thread"
    return imported, failed, None


def _serve_as_clone(clone: Clone, stop_grace_s: float, ready: dict) -> Command | Clone | None:
    for fd in (1, 2):
        os.dup2(clone.log_fd, fd)
    os.close(clone.log_fd)
    control = socket.socket(fileno=clone.channel_fd)
    zygote = Zygote(control, stop_grace_s)  # its handlers replace the source's
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CHILD_SIGNALS)
    try:
        send_message(control, ready)
    except OSError:
        return None
    return zygote.serve()


def main() -> None:
    parser = argparse.ArgumentParser(prog="trainflow-zygote")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--stop-grace-s", type=float, default=60.0)
    parser.add_argument("--preload", nargs="*", default=[])
    options = parser.parse_args()
    control = socket.socket(fileno=options.channel_fd)
    started = time.monotonic()
    imported, failed, unfit = preload(options.preload)
    ready = {
        "op": "ready" if unfit is None else "unfit",
        "imported": imported,
        "failed": failed,
        "reason": unfit,
        "import_s": round(time.monotonic() - started, 3),
    }
    try:
        send_message(control, ready)
    except OSError:
        return  # the launcher has gone while this was importing
    if unfit is not None:
        return
    # what the imports made stays out of every later collection: a fork's collector would otherwise
    # walk, and so copy, every page of it
    gc.freeze()
    command = Zygote(control, options.stop_grace_s).serve()
    while isinstance(command, Clone):  # this process is a clone: a zygote of its own from here on
        command = _serve_as_clone(command, options.stop_grace_s, {**ready, "import_s": 0.0})
    if command is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # its children are gone; tearing down the interpreter's imports would only cost time
    try:
        run(command)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
