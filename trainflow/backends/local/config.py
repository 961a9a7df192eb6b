"""The local backend's own spec section: its one field, `network`, is written in `resources:`."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from trainflow.section import BackendConfig

if TYPE_CHECKING:
    from trainflow.runspec import RunSpec


class LocalNetwork(str, Enum):
    loopback = "loopback"
    namespaces = "namespaces"


class LocalConfig(BackendConfig):
    """How the nodes of a job on this machine are connected."""

    location: ClassVar[str] = "resources"
    backend: Literal["local"] = "local"
    network: LocalNetwork = Field(
        default=LocalNetwork.loopback,
        title="Local network",
        description="Local backend: all nodes on loopback, "
        "or each in its own network namespace (root; node-loss drills).",
    )
    warm_workers: bool = Field(
        default=True,
        title="Warm workers",
        description="Local backend: each node keeps a standby interpreter that has imported torch, the runtime "
        "and the script's installed modules, and forks every attempt's agent and ranks (a recovery then "
        "starts no new interpreter). false: every attempt starts new interpreters.",
    )

    oversubscribe: bool = Field(
        default=False,
        title="Oversubscribe",
        description="Local backend: host more ranks per core than the capacity check allows (small models "
        "and tests, e.g. 32 or 64 ranks on a laptop); each rank still takes its own memory.",
    )

    def for_node_loss(self) -> LocalConfig:
        return self.model_copy(update={"network": LocalNetwork.namespaces})


def local_config(spec: RunSpec) -> LocalConfig:
    """The local backend's section of a RunSpec whose backend is local."""
    return spec.config_of(LocalConfig)
