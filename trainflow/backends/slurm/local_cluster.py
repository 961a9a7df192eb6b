"""A real Slurm cluster on this machine: munged, slurmctld and N slurmd, each slurmd a "host" in its
own network namespace with its own address. The Slurm tests bring one up; so does `make slurm-up`.

    python -m trainflow.backends.slurm.local_cluster up FOLDER [--nodes 3]   # prints SLURM_CONF
    python -m trainflow.backends.slurm.local_cluster down FOLDER

Needs root, iproute2 and Debian's slurmctld, slurmd, slurm-client and munge (installed when
missing). Everything lives under FOLDER (kept short: munge's socket path has a length limit);
`down` stops every daemon, removes the namespaces and says what, if anything, survived.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from trainflow.backends.netns import NetworkError, NodeNetwork
from trainflow.backends.slurm.cluster_config import write_config
from trainflow.backends.slurm.cluster_state import ClusterState, running, stop_cluster

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
COMMANDS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun", "munged")


class ClusterError(RuntimeError):
    """The local cluster could not be brought up."""


def ensure_installed() -> None:
    """Install the Debian packages when a Slurm or munge command is missing (CI starts bare)."""
    if all(shutil.which(c) for c in COMMANDS):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise ClusterError(f"{' '.join(command)} failed: {result.stderr.strip()[-2000:]}")
    missing = [c for c in COMMANDS if not shutil.which(c)]
    if missing:
        raise ClusterError(f"still missing after installing {', '.join(PACKAGES)}: {', '.join(missing)}")


class LocalCluster:
    def __init__(self, folder: Path, nodes: int = 3):
        self.folder = folder.resolve()
        self.nodes = nodes
        self.node_names = [f"node{i}" for i in range(nodes)]
        self.network: NodeNetwork | None = None
        self.state: ClusterState | None = None
        self.started_in_s: float | None = None

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What Slurm's commands need to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def namespace(self, node: str) -> str:
        return self.network.namespace(self.node_names.index(node))

    def cut(self, node: str) -> None:
        """Take a node off the network: its processes keep running, nothing reaches them."""
        self.network.cut(self.node_names.index(node))

    def restore(self, node: str) -> None:
        self.network.restore(self.node_names.index(node))

    def up(self, timeout_s: float = 60.0) -> LocalCluster:
        if os.geteuid() != 0:
            raise ClusterError("a local Slurm cluster needs root (network namespaces, munged, slurmd)")
        begun = time.monotonic()
        ensure_installed()
        for sub in ("munge", "state", "spool", "log", "etc"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o755)
        (self.folder / "munge").chmod(0o755)  # munged refuses a socket folder others cannot enter
        self.network = NodeNetwork(f"slurm:{self.folder}", self.nodes)
        self.state = ClusterState(str(self.folder), self.node_names, {})
        try:
            self.network.create()
            self.state.network = self.network.record()
            self.state.save()
            write_config(self.folder, self.conf, self.node_names, self.network)
            self._start_munge()
            self._start("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            for index, name in enumerate(self.node_names):
                self._start_slurmd(index, name)
            self._wait_until_idle(timeout_s)
        except BaseException:
            self.down()
            raise
        self.started_in_s = time.monotonic() - begun
        return self

    def _start_munge(self) -> None:
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        munge = self.folder / "munge"
        self._start(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={munge / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={self.folder / 'log' / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
        )
        self._wait_for(lambda: (munge / "munge.socket").exists(), 20, "munged's socket")

    def _start_slurmd(self, index: int, name: str) -> None:
        """slurmd inside the node's namespace with its own hostname and hosts file. `nsenter`, not
        `ip netns exec`: the latter remounts /sys, and slurmd 22.05 then fails to start."""
        inner = (
            f"hostname {name} && mount --bind {self.folder / 'etc' / 'hosts'} /etc/hosts && "
            f"mount --bind {self.folder / 'etc' / 'resolv.conf'} /etc/resolv.conf && "
            f"exec slurmd -D -N {name} -f {self.conf}"
        )
        self._start(
            f"slurmd-{name}",
            [
                "nsenter",
                f"--net=/run/netns/{self.network.namespace(index)}",
                "unshare",
                "--uts",
                "--mount",
                "sh",
                "-c",
                inner,
            ],
        )

    def _start(self, name: str, command: list[str]) -> None:
        log = open(self.folder / "log" / f"{name}.out", "ab")
        with log:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        self.state.pids[name] = proc.pid
        self.state.save()

    def _wait_for(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} not ready after {timeout_s:.0f}s; logs in {self.folder / 'log'}")
            dead = [n for n, pid in self.state.pids.items() if not running(pid)]
            if dead:
                raise ClusterError(f"{', '.join(dead)} exited while starting; logs in {self.folder / 'log'}")
            time.sleep(0.1)

    def _wait_until_idle(self, timeout_s: float) -> None:
        def idle() -> bool:
            result = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"],
                capture_output=True,
                text=True,
                env={**os.environ, **self.env},
                timeout=20,
            )
            states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
            return result.returncode == 0 and all(states.get(n) == "idle" for n in self.node_names)

        self._wait_for(idle, timeout_s, f"{self.nodes} idle node(s)")

    def down(self) -> list[str]:
        """Stop every daemon and remove the namespaces; returns what survived."""
        state = self.state or ClusterState.load(self.folder)
        if state is None:
            return []
        return stop_cluster(state)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.folder, args.nodes)
    if args.action == "down":
        survivors = cluster.down()
        if survivors:
            print(f"still running: {'; '.join(survivors)}", file=sys.stderr)
            return 1
        shutil.rmtree(args.folder, ignore_errors=True)
        return 0
    try:
        cluster.up()
    except (ClusterError, NetworkError) as exc:
        print(f"slurm-up: {exc}", file=sys.stderr)
        return 1
    print(f"{args.nodes} node(s) up in {cluster.started_in_s:.1f}s; use: export SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
