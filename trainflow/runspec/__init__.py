"""The run spec: everything about a training job, loaded from YAML and validated up front.

A spec that loads is a spec that can run: unknown keys, impossible values and missing files are
refused here, before anything is provisioned. One module per section; `run` composes them and
holds the checks that span sections; `load` reads files and `--set` overrides.
"""

from trainflow.runspec.checkpoint import Checkpoint, checkpoint_uri_problem
from trainflow.runspec.errors import SpecError, describe_validation_error
from trainflow.runspec.fault_tolerance import DEFAULT_RETRY_ON, FaultTolerance
from trainflow.runspec.load import apply_override, load_spec, parse_spec
from trainflow.runspec.parallel import CommBackend, Parallel, Strategy
from trainflow.runspec.resources import Backend, Resources
from trainflow.runspec.run import RunSpec
from trainflow.runspec.tracking import Tracking
from trainflow.runspec.workload import Workload, WorkloadMode
from trainflow.section import BackendConfig, Section, strict_number

__all__ = [
    "DEFAULT_RETRY_ON",
    "Backend",
    "BackendConfig",
    "Checkpoint",
    "CommBackend",
    "FaultTolerance",
    "Parallel",
    "Resources",
    "RunSpec",
    "Section",
    "SpecError",
    "Strategy",
    "Tracking",
    "Workload",
    "WorkloadMode",
    "apply_override",
    "checkpoint_uri_problem",
    "describe_validation_error",
    "load_spec",
    "parse_spec",
    "strict_number",
]
