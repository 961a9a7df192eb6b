"""The spec's `resources:` section: where the job runs and how big it is."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field

from trainflow.backends.catalog import backend_names
from trainflow.section import Section

# resources.backend takes the name of a registered backend; each backend's own settings are its
# config section (RunSpec.backend_config)
Backend = Enum("Backend", {name: name for name in backend_names()}, type=str)  # type: ignore[misc]  # members known at run time


class Resources(Section):
    """Where the job runs and how big it is."""

    backend: Backend = Field(
        default=Backend(backend_names()[0]), title="Backend", description="Launcher that runs the workers."
    )
    nodes: Annotated[int, Field(gt=0, le=1024)] = Field(default=2, title="Nodes", description="Number of nodes.")
    procs_per_node: Annotated[int, Field(gt=0, le=64)] = Field(
        default=1, title="Processes per node", description="Worker processes (ranks) on each node."
    )
    cpu: Annotated[float, Field(gt=0)] = Field(default=1.0, title="CPU per node", description="CPU cores per node.")
    memory: str = Field(
        default="2Gi",
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$",
        title="Memory per node",
        description="Memory per node, Kubernetes quantity (e.g. 2Gi).",
    )
    gpu: Annotated[int, Field(ge=0, le=16)] = Field(default=0, title="GPUs per node", description="GPUs per node.")
    min_nodes: Annotated[int, Field(gt=0, le=1024)] | None = Field(
        default=None,
        title="Minimum nodes",
        description="Continue with this many nodes when lost ones cannot come back (default: all nodes).",
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node
