"""The spec's `parallel:` section: how the model and data are split across the ranks."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import Field

from trainflow.section import Section


class Strategy(str, Enum):
    ddp = "ddp"
    fsdp = "fsdp"
    hybrid = "hybrid"


class CommBackend(str, Enum):
    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


class Parallel(Section):
    """How the model and data are split across the ranks."""

    strategy: Strategy = Field(default=Strategy.ddp, title="Strategy", description="Parallel strategy.")
    backend: CommBackend = Field(
        default=CommBackend.auto,
        title="Communication backend",
        description="Collective library: auto picks nccl with GPUs, gloo on CPU.",
    )
    data: Annotated[int, Field(gt=0)] | None = Field(
        default=None, title="Data-parallel degree", description="Defaults to world size / (tensor × pipeline)."
    )
    tensor: Annotated[int, Field(gt=0)] = Field(
        default=1, title="Tensor-parallel degree", description="Ranks that split each layer; within a node."
    )
    pipeline: Annotated[int, Field(gt=0)] = Field(
        default=1, title="Pipeline-parallel degree", description='Stages the model is cut into (`run.mesh`\'s "pp").'
    )
    collective_timeout_s: Annotated[float, Field(gt=0, le=7200)] = Field(
        default=600, title="Collective timeout (s)", description="Process-group timeout for one collective."
    )
