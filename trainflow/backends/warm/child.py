"""What a process forked by a zygote does to become its command, as if a new interpreter had been
started for it: `python -u script.py ARGS` or `python -u -m module ARGS` for a rank, torchrun's
agent for a node."""

from __future__ import annotations

import io
import os
import signal
import sys
import tempfile
from dataclasses import dataclass, field

from trainflow.backends.script_main import run_as_main
from trainflow.backends.store_sockets import LISTEN_FD_ENV
from trainflow.backends.warm.protocol import AGENT, WORKER, NotForkable

CHANNEL_FD_ENV = "TRAINFLOW_WARM_CHANNEL_FD"  # the agent's channel to its node's zygote
# the signals the zygote handles itself: blocked across a fork until the child has reset them
CHILD_SIGNALS = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


@dataclass
class Command:
    """What one forked process runs."""

    role: str
    argv: list[str]  # agent: torchrun's arguments; worker: the full command line
    env: dict[str, str]
    cwd: str
    target: str = ""  # a worker's script path or module name
    as_module: bool = False
    args: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, message: dict) -> Command:
        command = cls(role=message["role"], argv=list(message["argv"]), env=dict(message["env"]), cwd=message["cwd"])
        if command.role == WORKER:
            command.target, command.as_module, command.args = _python_command(command.argv)
        elif command.role != AGENT:
            raise NotForkable(f"unknown role {command.role!r}")
        return command


def _python_command(argv: list[str]) -> tuple[str, bool, list[str]]:
    """`python [-u] script ARGS` or `python [-u] -m module ARGS`, as torchrun starts a rank."""
    if not argv or argv[0] != sys.executable:  # another interpreter may have other packages
        raise NotForkable(f"not this interpreter: {argv[:1]}")
    rest = argv[1:]
    while rest and rest[0] == "-u":
        rest = rest[1:]
    if rest[:1] == ["-m"] and len(rest) >= 2:
        return rest[1], True, rest[2:]
    if not rest or rest[0].startswith("-"):
        raise NotForkable(f"interpreter options a fork cannot honour: {rest[:1]}")
    return rest[0], False, rest[1:]


def become(command: Command, stdio: list[int], channel_fd: int | None) -> None:
    """In the forked child, which already leads a session of its own: the command's environment,
    directory, stdio and default signal handling, and random seeds of its own."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CHILD_SIGNALS)
    os.chdir(command.cwd)
    os.environ.clear()
    os.environ.update(command.env)
    tempfile.tempdir = None  # the zygote's choice is cached: the command's TMPDIR counts from here on
    if channel_fd is not None:
        os.environ[CHANNEL_FD_ENV] = str(channel_fd)
    for target, fd in enumerate(stdio[:3]):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    if command.role == AGENT and len(stdio) > 3:  # the rendezvous store's listening socket, kept as received
        os.environ[LISTEN_FD_ENV] = str(stdio[3])
    _unbuffered_stdio()
    _fresh_seeds()


def run(command: Command) -> None:
    """Run the command in this process; returns only by SystemExit, as an interpreter would end."""
    if command.role == AGENT:
        from trainflow.backends import agent
        from trainflow.backends.warm import torchrun_hook

        sys.argv = ["torchrun", *command.argv]
        torchrun_hook.install(int(os.environ.pop(CHANNEL_FD_ENV)))
        agent.main()
        return
    run_as_main(command.target, command.args, command.as_module)


def _unbuffered_stdio() -> None:
    """New text streams over the new descriptors, unbuffered as with `python -u`."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="surrogateescape"
    )
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="surrogateescape", write_through=True
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )


def _fresh_seeds() -> None:
    """A new interpreter seeds torch's and NumPy's global generators from the OS; a fork would
    share the zygote's (`random` reseeds itself after a fork)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
