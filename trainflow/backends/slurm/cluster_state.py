"""A local cluster's daemons and namespaces as saved in its folder, and stopping them, possibly
from another process than the one that started them."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainflow.backends.netns import NodeNetwork

STATE_FILE = "cluster.json"


@dataclass
class ClusterState:
    """What `down` needs, possibly from another process: the daemons and the namespaces."""

    folder: str
    node_names: list[str]
    network: dict
    pids: dict[str, int] = field(default_factory=dict)

    def save(self) -> None:
        (Path(self.folder) / STATE_FILE).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, folder: Path) -> ClusterState | None:
        path = folder / STATE_FILE
        return cls(**json.loads(path.read_text())) if path.exists() else None


def running(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:  # not our child (`down` from another process)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return not Path(f"/proc/{pid}/status").read_text().count("State:\tZ")
    return True


def stop_session(pid: int, timeout_s: float = 15.0) -> bool:
    """SIGTERM the daemon's session, SIGKILL it if it lingers; True once it is gone."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not running(pid):
                return True
            time.sleep(0.05)
    return not running(pid)


def stop_cluster(state: ClusterState) -> list[str]:
    survivors = []
    # nodes first (they end their jobs' steps), then the controller, then munge
    order = sorted(state.pids, key=lambda n: (not n.startswith("slurmd"), n == "munged"))
    for name in order:
        if not stop_session(state.pids[name]):
            survivors.append(f"{name} (pid {state.pids[name]})")
    state.pids.clear()
    if state.network:
        network = NodeNetwork.from_record(state.network)
        survivors.extend(network.destroy())
        state.network = {}
    state.save()
    return survivors
