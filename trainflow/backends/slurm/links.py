"""Node links of a cluster brought up by `local_cluster` on this machine, for node-loss drills: cut
one node's link (its processes keep running, nothing reaches them) and restore it afterwards.

Found through SLURM_CONF's folder; a cluster trainflow did not bring up has none, and drills that
cut links are refused there. The namespaces belong to the cluster, not to the run, so the run's
allocation gives no network record and a reaper never removes them.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainflow.backends.netns import NodeNetwork
from trainflow.backends.slurm.cluster_state import ClusterState


class ClusterLinks:
    def __init__(self, network: NodeNetwork, node_names: list[str], hosts: list[str]):
        self.network, self.node_names, self.hosts = network, node_names, hosts
        self.cut_slots: set[int] = set()

    @classmethod
    def for_cluster(cls, hosts: list[str]) -> ClusterLinks | None:
        conf = os.environ.get("SLURM_CONF")
        state = ClusterState.load(Path(conf).parent) if conf else None
        if state is None or not state.network:
            return None
        return cls(NodeNetwork.from_record(state.network), state.node_names, hosts)

    def _index(self, slot: int) -> int:
        return self.node_names.index(self.hosts[slot])

    def namespace(self, slot: int) -> str:
        return self.network.namespace(self._index(slot))

    def cut(self, slot: int) -> None:
        self.network.cut(self._index(slot))
        self.cut_slots.add(slot)

    def restore(self, slot: int) -> None:
        if slot in self.cut_slots:
            self.network.restore(self._index(slot))
            self.cut_slots.discard(slot)

    def restore_all(self) -> None:
        for slot in list(self.cut_slots):
            self.restore(slot)
