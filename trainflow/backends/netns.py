"""One network namespace per node: several "hosts" with their own addresses on this machine.

A bridge in the root namespace joins them; the orchestrator listens on the bridge's address. A
node's link can be cut (and restored), which is how a node drops off the network without any of
its processes exiting. Needs root and iproute2.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

NETNS_ETC = Path("/etc/netns")  # `ip netns exec` bind-mounts /etc/netns/<name>/* over /etc/*


class NetworkError(RuntimeError):
    """Namespaces or links could not be set up."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _used_networks() -> list[ipaddress.IPv4Network]:
    routes = _ip("-4", "route", "show", "table", "all", check=False).stdout.split("\n")
    networks = []
    for line in routes:
        first = line.split(" ", 1)[0]
        if "/" in first:
            try:
                networks.append(ipaddress.ip_network(first, strict=False))
            except ValueError:
                continue
    return networks


def network_tag(run_id: str) -> str:
    """What names a run's namespaces (`tf-<tag>-<node>`), its bridge and its links."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:6]


class NodeNetwork:
    def __init__(self, run_id: str, nodes: int):
        self.tag = network_tag(run_id)
        self.nodes = nodes
        self.bridge = f"tfb{self.tag}"
        self.subnet = self._pick_subnet()
        self.created: list[str] = []

    def _pick_subnet(self) -> ipaddress.IPv4Network:
        used = _used_networks()
        seed = int(self.tag, 16)
        for offset in range(256):
            index = (seed + offset) % (64 * 256)
            candidate = ipaddress.ip_network(f"10.{192 + index // 256}.{index % 256}.0/24")
            if not any(candidate.overlaps(n) for n in used):
                return candidate
        raise NetworkError("no free /24 left in 10.192.0.0/10 for node namespaces")

    def record(self) -> dict:
        """Enough to remove these namespaces later, from another process."""
        return {"tag": self.tag, "nodes": self.nodes, "subnet": str(self.subnet), "created": list(self.created)}

    @classmethod
    def from_record(cls, record: dict) -> NodeNetwork:
        network = cls.__new__(cls)
        network.tag, network.nodes = record["tag"], record["nodes"]
        network.bridge = f"tfb{network.tag}"
        network.subnet = ipaddress.ip_network(record["subnet"])
        network.created = list(record["created"])
        return network

    def namespace(self, node: int) -> str:
        return f"tf-{self.tag}-{node}"

    def host_link(self, node: int) -> str:
        return f"tfv{self.tag}{node}"

    @property
    def host_address(self) -> str:
        return str(self.subnet.network_address + 1)

    def node_address(self, node: int) -> str:
        return str(self.subnet.network_address + 10 + node)

    def create(self) -> None:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self.created.append(f"link:{self.bridge}")
            _ip("addr", "add", f"{self.host_address}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for node in range(self.nodes):
                self._create_node(node)
        except Exception:
            self.destroy()
            raise

    def _create_node(self, node: int) -> None:
        ns, host, peer = self.namespace(node), self.host_link(node), f"tfp{self.tag}{node}"
        _ip("netns", "add", ns)
        self.created.append(f"netns:{ns}")
        self._write_name_service(ns)
        _ip("link", "add", host, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("-n", ns, "link", "set", peer, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{self.node_address(node)}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", self.host_address)
        _ip("link", "set", host, "master", self.bridge)
        _ip("link", "set", host, "up")

    def _write_name_service(self, ns: str) -> None:
        """Names for every address and no reachable DNS server: gloo's and c10d's lookups of peer
        names are answered at once instead of timing out against a resolver the namespace cannot reach."""
        folder = NETNS_ETC / ns
        folder.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", f"{self.host_address} trainflow-orchestrator"]
        lines += [f"{self.node_address(n)} trainflow-node-{n}" for n in range(self.nodes)]
        (folder / "hosts").write_text("\n".join(lines) + "\n")
        (folder / "resolv.conf").write_text("options timeout:1 attempts:1\n")

    def wrap(self, command: list[str], node: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(node), *command]

    def cut(self, node: int) -> None:
        _ip("link", "set", self.host_link(node), "down")

    def restore(self, node: int) -> None:
        _ip("link", "set", self.host_link(node), "up")

    def destroy(self) -> list[str]:
        """Remove every namespace and link; returns what could not be removed."""
        for item in reversed(self.created):
            kind, name = item.split(":", 1)
            if kind == "netns":
                _ip("netns", "del", name, check=False)
                shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
            else:
                _ip("link", "del", name, check=False)
        self.created.clear()
        return self.leftovers()

    def leftovers(self) -> list[str]:
        namespaces = _ip("netns", "list", check=False).stdout
        links = _ip("-o", "link", "show", check=False).stdout
        left = [f"netns {self.namespace(n)}" for n in range(self.nodes) if self.namespace(n) in namespaces]
        left += [
            str(NETNS_ETC / self.namespace(n)) for n in range(self.nodes) if (NETNS_ETC / self.namespace(n)).exists()
        ]
        if f" {self.bridge}:" in links or f" {self.bridge}@" in links:
            left.append(f"bridge {self.bridge}")
        return left


class NodeLinks(Protocol):
    """Node links that can be cut by node slot: a run's own NodeNetwork or a local cluster's links."""

    def namespace(self, slot: int) -> str: ...

    def cut(self, slot: int) -> None: ...


@dataclass
class LostSlots:
    """Node slots a node-loss drill took away for good, and those of them a replacement comes back
    for once the job has gone on without them."""

    never: set[int] = field(default_factory=set)
    replaced_later: set[int] = field(default_factory=set)
    replaced: set[int] = field(default_factory=set)  # slots whose replacement came: the slot serves again

    def lose(self, slot: int, replaced_later: bool) -> None:
        self.never.add(slot)
        if replaced_later:
            self.replaced_later.add(slot)

    def may_return(self, slot: int) -> bool:
        """Whether `slot` can come back now. A slot replaced later cannot the first time it is asked
        for (the job shrinks without it) and can every time after."""
        if slot in self.replaced_later:
            self.replaced_later.discard(slot)
            self.never.discard(slot)
            self.replaced.add(slot)
            return False
        return slot not in self.never


def cut_node_link(
    links: NodeLinks | None, lost: LostSlots, slot: int, permanent: bool, replaced_later: bool, without_links: str
) -> str:
    """Cut one node slot's link for a node-loss drill (`permanent`: the slot is not restored; see
    LostSlots for `replaced_later`); returns what was cut. RuntimeError(`without_links`) where there
    are no links to cut."""
    if links is None:
        raise RuntimeError(without_links)
    if permanent:
        lost.lose(slot, replaced_later)
    links.cut(slot)
    return f"namespace {links.namespace(slot)}"
