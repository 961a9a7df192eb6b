"""Launchers: how workers are provisioned, started, watched, stopped and released.

A backend is chosen by `resources.backend` and registered once; flows and tasks never branch on it.
"""

from __future__ import annotations

from collections.abc import Callable

from trainflow.backends.base import Allocation, AttemptHandle, AttemptPlan, Launcher, NodeExit, ReleaseReport
from trainflow.spec import RunSpec

__all__ = [
    "Allocation", "AttemptHandle", "AttemptPlan", "Launcher", "NodeExit", "ReleaseReport",
    "launcher_for", "register",
]

_REGISTRY: dict[str, Callable[[], Launcher]] = {}


def register(name: str) -> Callable:
    def decorate(factory: Callable[[], Launcher]) -> Callable[[], Launcher]:
        _REGISTRY[name] = factory
        return factory

    return decorate


def launcher_for(spec: RunSpec) -> Launcher:
    name = spec.resources.backend.value
    if name == "local":
        import trainflow.backends.local  # noqa: F401  (registers itself)
    if name == "kubernetes":
        import trainflow.backends.kubernetes  # noqa: F401  (registers itself)
    if name == "slurm":
        import trainflow.backends.slurm.launcher  # noqa: F401  (registers itself)
    if name not in _REGISTRY:
        raise ValueError(f"resources.backend: {name!r} is not available in this installation")
    return _REGISTRY[name]()
