"""validate_spec: everything that can be checked before a single resource is touched."""

from __future__ import annotations

from tasks import lifecycle_task
from trainflow.preflight import preflight
from trainflow.runspec import RunSpec


@lifecycle_task(name="validate-spec")
def validate_spec(spec: RunSpec) -> RunSpec:
    """Check the spec against the world: entrypoint present, checkpoint store reachable."""
    preflight(spec)
    return spec
