"""The local backend's warm workers (backends/warm): one zygote per node slot, started when the run
is provisioned so its imports overlap the preparation, ready before the first launch, and asked
for each attempt's agent; ended, and counted, at release."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainflow.backends.warm.child import AGENT, NotForkable
from trainflow.backends.warm.client import ForkedProcess, ZygoteChannel
from trainflow.backends.warm.preload import modules_to_preload
from trainflow.private_files import open_private
from trainflow.spec import WorkloadMode

log = logging.getLogger("trainflow.local")

READY_TIMEOUT_S = 300.0
CLOSE_TIMEOUT_S = 10.0


@dataclass
class WarmPool:
    """One node slot's zygote, as the launcher holds it."""

    slot: int
    process: subprocess.Popen
    channel: ZygoteChannel
    log_path: Path
    unusable: str | None = None  # why this slot's attempts start cold

    def start_agent(self, argv: list[str], env: dict[str, str], log_fd: int) -> ForkedProcess | None:
        """The node's torchrun agent, forked; None (and the reason logged once) where it must start cold."""
        if self.unusable is None and self.channel.wait_ready(READY_TIMEOUT_S) is None:
            self.unusable = _why_not_ready(self)
        if self.unusable is None:
            with open(os.devnull, "rb") as devnull:
                try:
                    return self.channel.fork(AGENT, argv, env, os.getcwd(), [devnull.fileno(), log_fd, log_fd])
                except NotForkable as exc:
                    self.unusable = str(exc)
        log.warning("node slot %d starts cold: %s", self.slot, self.unusable)
        return None

    def close(self) -> None:
        """Ask the zygote to end: it ends its children, if any are left, then itself."""
        if self.channel.ready is None:
            self.process.kill()  # still importing (the run ended before its first launch): nothing to save
        self.channel.close()

    def wait_closed(self) -> bool:
        """True once the zygote has gone (killed if it takes too long)."""
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


def start_pools(spec, slots: list[int], scratch: Path, env: dict[str, str], wrap) -> dict[int, WarmPool]:
    """A zygote per node slot, each in its slot's network (`wrap` puts a command there)."""
    preload = modules_to_preload(spec.workload.entrypoint, spec.workload.preload, spec.workload.mode == WorkloadMode.runtime, Path.cwd())
    grace_s = spec.fault_tolerance.preemption_grace_s + 30.0  # torchrun's own stop, then its SIGKILL
    pools = {}
    for slot in slots:
        ours, theirs = socket.socketpair()
        log_path = scratch / f"warm-{slot}.log"
        command = [sys.executable, "-m", "trainflow.backends.warm.zygote", "--channel-fd", str(theirs.fileno()),
                   "--stop-grace-s", str(grace_s), "--preload", *preload]
        with open(open_private(log_path, append=True), "ab") as log_file:
            process = subprocess.Popen(wrap(command, slot), env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                       stderr=subprocess.STDOUT, pass_fds=[theirs.fileno()], start_new_session=True)
        theirs.close()
        pools[slot] = WarmPool(slot, process, ZygoteChannel(ours), log_path)
    return pools


def _why_not_ready(pool: WarmPool) -> str:
    ready = pool.channel.ready
    if ready is not None and ready.get("op") == "unfit":
        return ready.get("reason") or "unfit"
    code = pool.process.poll()
    if code is not None:
        return f"its standby interpreter exited with {code} (see {pool.log_path})"
    return f"its standby interpreter was not ready within {READY_TIMEOUT_S:.0f} s"
