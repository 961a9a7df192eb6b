"""Checks of a valid spec against this machine, made before anything is provisioned."""

from __future__ import annotations

import os
from pathlib import Path

from trainflow.backends import launcher_for
from trainflow.backends.abilities import ChecksSpec
from trainflow.checkpoint.catalog import latest_verified
from trainflow.checkpoint.storage import StorageError, open_storage
from trainflow.entrypoint_check import compile_problem, imports_runtime
from trainflow.home import resolve_checkpoint_uri
from trainflow.prefect.rest import unreachable_server
from trainflow.runspec import RunSpec, SpecError, WorkloadMode


def preflight(spec: RunSpec, resume: bool = False) -> None:
    """Raise SpecError naming the field when the spec cannot run here (with `resume`, from its
    newest verified checkpoint)."""
    entrypoint = Path(spec.workload.entrypoint)
    if not entrypoint.is_file():
        raise SpecError(f"workload.entrypoint: {entrypoint} not found (relative to {Path.cwd()})")
    if entrypoint.suffix != ".py":
        raise SpecError(f"workload.entrypoint: {entrypoint} is not a Python script")
    script_problem = compile_problem(entrypoint)
    if script_problem is not None:
        raise SpecError(f"workload.entrypoint: {script_problem.line}")
    if spec.workload.mode == WorkloadMode.runtime and imports_runtime(entrypoint) is False:
        raise SpecError(
            f"workload.entrypoint: {entrypoint} never imports trainflow.runtime (nor does a module of "
            "its own); to run it as a plain torchrun script, set workload.mode: plain"
        )
    unset = [name for name in spec.workload.secret_env if name not in os.environ]
    if unset:
        raise SpecError(f"workload.secret_env: {', '.join(unset)} not set in the orchestrator's environment")
    tracking = spec.tracking.uri
    if tracking and not tracking.startswith(("sqlite:///", "http://", "https://", "databricks", "postgresql", "mysql")):
        raise SpecError(f"tracking.uri: {tracking!r} is not a supported MLflow store (sqlite:///..., http(s)://...)")
    launcher = launcher_for(spec)
    if isinstance(launcher, ChecksSpec):
        launcher.preflight(spec)
    problem = unreachable_server()
    if problem:
        raise SpecError(problem)
    # last: checking a local checkpoint folder creates it
    try:
        storage = open_storage(resolve_checkpoint_uri(spec.checkpoint.uri))
        storage.check()
        newest = latest_verified(storage) if resume else None
    except StorageError as exc:
        raise SpecError(f"checkpoint.uri: {exc}") from None
    if newest is not None and newest.step > spec.workload.steps:
        raise SpecError(
            f"workload.steps: {spec.workload.steps}, but --resume would continue from step {newest.step} (the "
            f"newest verified checkpoint under {spec.checkpoint.uri}); give at least {newest.step} steps"
        )
