"""The run spec: everything about a training job, loaded from YAML and validated up front.

A spec that loads is a spec that can run: unknown keys, impossible values and missing files are
refused here, before anything is provisioned. One module per section; `run` composes them and
holds the checks that span sections; `load` reads files and `--set` overrides.
"""

from trainflow.section import BackendConfig, Section, strict_number
from trainflow.spec.checkpoint import Checkpoint, checkpoint_uri_problem
from trainflow.spec.errors import SpecError, describe_validation_error
from trainflow.spec.fault_tolerance import DEFAULT_RETRY_ON, FaultTolerance
from trainflow.spec.load import apply_override, load_spec, parse_spec
from trainflow.spec.parallel import CommBackend, Parallel, Strategy
from trainflow.spec.resources import Backend, Resources
from trainflow.spec.run import RunSpec
from trainflow.spec.tracking import Tracking
from trainflow.spec.workload import Workload, WorkloadMode

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
