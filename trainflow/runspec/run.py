"""RunSpec: the whole job, composed of the sections, with the checks that span them."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import Field, GetJsonSchemaHandler, SerializationInfo, model_serializer, model_validator
from pydantic_core import CoreSchema

from trainflow.runspec.backend_section import BackendConfigs, from_user_shape, to_user_shape, user_shaped_schema
from trainflow.runspec.checkpoint import Checkpoint
from trainflow.runspec.fault_tolerance import FaultTolerance
from trainflow.runspec.parallel import CommBackend, Parallel, Strategy
from trainflow.runspec.resources import Resources
from trainflow.runspec.tracking import Tracking
from trainflow.runspec.workload import Workload
from trainflow.section import BackendConfig, Section

Config = TypeVar("Config", bound=BackendConfig)


class RunSpec(Section):
    """A training job: what to train, where, how it is split, saved, protected and recorded."""

    name: str = Field(
        pattern=r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$",
        title="Name",
        description="Job name: lowercase letters, digits and dashes.",
    )
    seed: Annotated[int, Field(ge=0, lt=2**32)] = Field(
        default=0, title="Seed", description="Rank r seeds its RNGs with seed + r; the data order uses the seed."
    )
    workload: Workload
    resources: Resources = Field(default_factory=Resources)
    parallel: Parallel = Field(default_factory=Parallel)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    fault_tolerance: FaultTolerance = Field(default_factory=FaultTolerance)
    tracking: Tracking = Field(default_factory=Tracking)
    backend_config: BackendConfigs = Field(
        title="Backend settings",
        description="The chosen backend's own section, written where that backend reads it "
        "(e.g. slurm:, kubernetes:, resources.network).",
    )

    @model_validator(mode="before")
    @classmethod
    def _backend_section_from_where_it_is_written(cls, raw: Any) -> Any:
        return from_user_shape(raw, cls._sections(), Resources.model_fields["backend"].default.value)

    @model_validator(mode="after")
    def _backend_section_fits_the_spec(self) -> RunSpec:
        if self.backend_config.backend != self.resources.backend.value:
            raise ValueError(
                f"resources.backend: {self.resources.backend.value}, but the backend section is "
                f"{self.backend_config.backend}'s"
            )
        needs_remote = self.backend_config.remote_checkpoints_because
        if needs_remote and not self.checkpoint.is_remote:
            raise ValueError(
                f"checkpoint.uri: the {self.backend_config.backend} backend needs an s3:// URI ({needs_remote})"
            )
        self.backend_config.check()
        return self

    @model_serializer(mode="wrap")
    def _backend_section_where_it_is_written(self, handler: Any, info: SerializationInfo) -> dict:
        return to_user_shape(handler(self), info.mode, info.by_alias, self._sections())

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        schema = handler(core_schema)
        user_shaped_schema(handler.resolve_ref_schema(schema), handler.resolve_ref_schema, cls._sections())
        return schema

    @classmethod
    def _sections(cls) -> list[str]:
        return [name for name in cls.model_fields if name != "backend_config"]

    def config_of(self, kind: type[Config]) -> Config:
        """The backend's own section, typed as that backend's config (which it must be)."""
        if not isinstance(self.backend_config, kind):
            raise TypeError(f"resources.backend is {self.resources.backend.value}, not the backend of {kind.__name__}")
        return self.backend_config

    @model_validator(mode="after")
    def _degrees_match_world_size(self) -> RunSpec:
        world = self.resources.world_size
        model_degree = self.parallel.tensor * self.parallel.pipeline
        if self.parallel.data is None:
            if world % model_degree:
                raise ValueError(f"parallel: tensor × pipeline = {model_degree} does not divide the world size {world}")
            self.parallel.data = world // model_degree
        product = self.parallel.data * model_degree
        if product != world:
            raise ValueError(
                f"parallel: data × tensor × pipeline = {product} but the world size (nodes × procs_per_node) is {world}"
            )
        min_nodes = self.resources.min_nodes
        if min_nodes is not None:
            if min_nodes > self.resources.nodes:
                raise ValueError(
                    f"resources.min_nodes: {min_nodes} is more than resources.nodes ({self.resources.nodes})"
                )
            if (min_nodes * self.resources.procs_per_node) % model_degree:
                raise ValueError(
                    f"resources.min_nodes: tensor × pipeline = {model_degree} does not divide the smaller world"
                )
        if self.parallel.strategy == Strategy.hybrid and self.resources.procs_per_node % model_degree:
            raise ValueError(
                f"parallel.strategy: hybrid shards within a node, so tensor × pipeline = {model_degree} "
                f"must divide resources.procs_per_node ({self.resources.procs_per_node})"
            )
        if self.parallel.backend == CommBackend.nccl and self.resources.gpu == 0:
            raise ValueError("parallel.backend: nccl needs resources.gpu > 0")
        if self.resources.gpu and self.resources.procs_per_node > self.resources.gpu:
            raise ValueError("resources.procs_per_node: more processes than GPUs on a node")
        return self

    @model_validator(mode="after")
    def _in_process_restart_fits(self) -> RunSpec:
        if not self.fault_tolerance.in_process_restart:
            return self
        if self.workload.mode.value != "runtime":
            raise ValueError(
                "fault_tolerance.in_process_restart: needs workload.mode runtime (a plain script keeps no "
                "in-memory copy to go back to)"
            )
        if self.fault_tolerance.rules:
            raise ValueError(
                "fault_tolerance.in_process_restart: cannot be combined with fault_tolerance.rules (ranks "
                "recovering in place decide by the built-in classification only)"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.resources.world_size

    def with_nodes(self, nodes: int) -> RunSpec:
        """The same job on fewer nodes (after a lost node is excluded); degrees follow the world size."""
        raw = self.model_dump(mode="json")
        raw["resources"]["nodes"] = nodes
        raw["parallel"]["data"] = None
        return RunSpec.model_validate(raw)

    def comm_backend(self) -> str:
        if self.parallel.backend != CommBackend.auto:
            return self.parallel.backend.value
        return "nccl" if self.resources.gpu > 0 else "gloo"

    def spec_hash(self) -> str:
        """sha256 of the resolved spec in canonical form: two runs of one job share it."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
