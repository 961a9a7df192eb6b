"""Checks of a valid spec against this machine, made before anything is provisioned."""

from __future__ import annotations

import os
from pathlib import Path

from trainflow.backends import launcher_for
from trainflow.capacity import local_capacity_problem
from trainflow.checkpoint.storage import StorageError, open_storage
from trainflow.home import resolve_checkpoint_uri
from trainflow.spec import Backend, RunSpec, SpecError


def preflight(spec: RunSpec) -> None:
    """Raise SpecError naming the field when the spec cannot run here."""
    entrypoint = Path(spec.workload.entrypoint)
    if not entrypoint.is_file():
        raise SpecError(f"workload.entrypoint: {entrypoint} not found (relative to {Path.cwd()})")
    if entrypoint.suffix != ".py":
        raise SpecError(f"workload.entrypoint: {entrypoint} is not a Python script")
    unset = [name for name in spec.workload.secret_env if name not in os.environ]
    if unset:
        raise SpecError(f"workload.secret_env: {', '.join(unset)} not set in the orchestrator's environment")
    tracking = spec.tracking.uri
    if tracking and not tracking.startswith(("sqlite:///", "http://", "https://", "databricks", "postgresql", "mysql")):
        raise SpecError(f"tracking.uri: {tracking!r} is not a supported MLflow store (sqlite:///..., http(s)://...)")
    # a remote backend's nodes are other machines: this one's size says nothing about them
    if spec.resources.backend == Backend.local:
        problem = local_capacity_problem(spec.resources)
        if problem:
            raise SpecError(problem)
    # last: checking a local checkpoint folder creates it
    try:
        open_storage(resolve_checkpoint_uri(spec.checkpoint.uri)).check()
    except StorageError as exc:
        raise SpecError(f"checkpoint.uri: {exc}") from None
    backend_check = getattr(launcher_for(spec), "preflight", None)  # a backend's own checks, if it has any
    if backend_check is not None:
        backend_check(spec)
