"""The local backend's warm workers (backends/warm): one zygote per node slot, started when the run
is provisioned so its imports overlap the preparation, ready before the first launch, and asked
for each attempt's agent; ended, and counted, at release.

On the host's network only the first slot's zygote imports; the other slots' zygotes are its
clones, forked at their first launch with every import done. `trainflow run` also gives that
zygote a head start: once the spec is valid it starts it, marked with the run id the flow will
use, so that it imports torch while the orchestrator imports Prefect and MLflow and plans the
run, and the provisioning takes it instead of starting its own."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from trainflow.backends.warm.child import AGENT, NotForkable
from trainflow.backends.warm.client import ForkedProcess, ZygoteChannel
from trainflow.backends.warm.preload import modules_to_preload
from trainflow.private_files import open_private, private_folder
from trainflow.runspec import WorkloadMode
from trainflow.worker_config import JOB_ENV

log = logging.getLogger("trainflow.local")

READY_TIMEOUT_S = 300.0
CLOSE_TIMEOUT_S = 10.0

Wrap = Callable[[list[str], int], list[str]]  # puts a command in a node slot's network namespace


@dataclass
class WarmPool:
    """One node slot's zygote, as the launcher holds it: started, or a clone still to be made."""

    slot: int
    log_path: Path
    preload: list[str]
    env: dict[str, str] = field(repr=False)
    process: subprocess.Popen | ForkedProcess | None = None
    channel: ZygoteChannel | None = None
    source: WarmPool | None = None  # a clone's, until it is made: the zygote it is forked from
    unusable: str | None = None  # why this slot's attempts start cold

    def start_agent(
        self, argv: list[str], env: dict[str, str], log_fd: int, listen_fd: int | None = None
    ) -> ForkedProcess | None:
        """The node's torchrun agent, forked (with the rendezvous store's listening socket, if given);
        None (and the reason logged once) where it must start cold."""
        if self.unusable is None and self.channel is None:
            self._clone()
        if self.unusable is None and self.channel.wait_ready(READY_TIMEOUT_S) is None:
            self.unusable = _why_not_ready(self)
        if self.unusable is None:
            with open(os.devnull, "rb") as devnull:
                try:
                    passed = [listen_fd] if listen_fd is not None else []
                    return self.channel.fork(AGENT, argv, env, os.getcwd(), [devnull.fileno(), log_fd, log_fd, *passed])
                except NotForkable as exc:
                    self.unusable = str(exc)
        log.warning("node slot %d starts cold: %s", self.slot, self.unusable)
        return None

    def _clone(self) -> None:
        source = self.source
        if source.channel is None or source.unusable or source.channel.wait_ready(READY_TIMEOUT_S) is None:
            self.unusable = f"the standby interpreter of slot {source.slot} is not usable"
            return
        with open(open_private(self.log_path, append=True), "ab") as log_file:
            try:
                self.channel, self.process = source.channel.clone(log_file.fileno())
            except NotForkable as exc:
                self.unusable = f"cloning the standby interpreter of slot {source.slot}: {exc}"

    @property
    def alive(self) -> bool:
        if self.process is None:
            return self.source is not None and self.source.alive
        return self.process.poll() is None

    def close(self) -> None:
        """Ask the zygote to end: it ends its children, if any are left, then itself."""
        if self.channel is None:
            return  # a clone never made
        if self.channel.ready is None:
            self.process.kill()  # still importing (the run ended before its first launch): nothing to save
        self.channel.close()

    def wait_closed(self) -> bool:
        """True once the zygote has gone (killed if it takes too long); False if it never started."""
        if self.process is None:
            return False
        try:
            self.process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return True


def close_pools(pools: dict[int, WarmPool]) -> int:
    """End every zygote, all at once; how many were ended."""
    for pool in pools.values():
        pool.close()
    return sum(pool.wait_closed() for pool in pools.values())


def start_pools(spec, slots: list[int], scratch: Path, env: dict[str, str], wrap: Wrap | None) -> dict[int, WarmPool]:
    """A zygote per node slot, each in its slot's network (`wrap` puts a command there). On the
    host's network (`wrap` None) the first slot's zygote is a head start's where one was started
    for this same command and environment, and the others are its clones."""
    preload = _preload(spec)
    if wrap is not None:
        return {slot: _start(slot, preload, _grace_s(spec), scratch / f"warm-{slot}.log", env, wrap) for slot in slots}
    first, *others = slots
    source = _take_head_start(preload, env)
    if source is not None:
        os.replace(source.log_path, scratch / f"warm-{first}.log")  # the zygote goes on writing to it
        source.slot, source.log_path = first, scratch / f"warm-{first}.log"
    else:
        source = _start(first, preload, _grace_s(spec), scratch / f"warm-{first}.log", env, None)
    return {first: source, **{slot: _clone_of(source, slot, scratch / f"warm-{slot}.log") for slot in others}}


@contextmanager
def head_start(spec, env: dict[str, str], folder: Path) -> Iterator[None]:
    """A zygote for a run on the host's network starts now, with `env` (whose job marker is the
    run's id); if no provisioning has taken it when the block ends, it is ended. Its log waits in
    `folder` until a provisioning takes it."""
    private_folder(folder)  # runs/: nobody else may see a run's id before it starts
    pool = _start(0, _preload(spec), _grace_s(spec), folder / f"{env[JOB_ENV]}.warm.log", env, None)
    _HEAD_START.append(pool)
    try:
        yield
    finally:
        if pool in _HEAD_START:
            _HEAD_START.remove(pool)
            close_pools({0: pool})
            pool.log_path.unlink(missing_ok=True)


_HEAD_START: list[WarmPool] = []  # started by head_start, not yet taken


def _take_head_start(preload: list[str], env: dict[str, str]) -> WarmPool | None:
    for pool in _HEAD_START:
        if pool.preload == preload and _comparable(pool.env) == _comparable(env) and pool.alive:
            _HEAD_START.remove(pool)
            return pool
    return None


# what the orchestrator's own libraries set in its environment for themselves while it starts (an
# MLflow telemetry session, Prefect's settings): no preloaded module reads them at import, and the
# forked processes get the environment of their own request
_ORCHESTRATORS_OWN = ("PREFECT_", "MLFLOW_", "_MLFLOW_")


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if not key.startswith(_ORCHESTRATORS_OWN)}


def _preload(spec) -> list[str]:
    return modules_to_preload(
        spec.workload.entrypoint, spec.workload.preload, spec.workload.mode == WorkloadMode.runtime, Path.cwd()
    )


def _grace_s(spec) -> float:
    return spec.fault_tolerance.preemption_grace_s + 30.0  # torchrun's own stop, then its SIGKILL


def _start(
    slot: int, preload: list[str], grace_s: float, log_path: Path, env: dict[str, str], wrap: Wrap | None
) -> WarmPool:
    ours, theirs = socket.socketpair()
    command = [
        sys.executable,
        "-m",
        "trainflow.backends.warm.zygote",
        "--channel-fd",
        str(theirs.fileno()),
        "--stop-grace-s",
        str(grace_s),
        "--preload",
        *preload,
    ]
    with open(open_private(log_path, append=True), "ab") as log_file:
        process = subprocess.Popen(
            wrap(command, slot) if wrap else command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            pass_fds=[theirs.fileno()],
            start_new_session=True,
        )
    theirs.close()
    return WarmPool(slot, log_path, preload, env, process=process, channel=ZygoteChannel(ours))


def _clone_of(source: WarmPool, slot: int, log_path: Path) -> WarmPool:
    return WarmPool(slot, log_path, source.preload, source.env, source=source)


def _why_not_ready(pool: WarmPool) -> str:
    ready = pool.channel.ready
    if ready is not None and ready.get("op") == "unfit":
        return ready.get("reason") or "unfit"
    code = pool.process.poll()
    if code is not None:
        return f"its standby interpreter exited with {code} (see {pool.log_path})"
    return f"its standby interpreter was not ready within {READY_TIMEOUT_S:.0f} s"
