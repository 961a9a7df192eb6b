"""Launchers: how workers are provisioned, started, watched, stopped and released.

A backend is chosen by `resources.backend` and registered once; flows and tasks never branch on it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainflow.backends.base import Allocation, AttemptHandle, AttemptPlan, Launcher, NodeExit, ReleaseReport
from trainflow.backends.catalog import LAUNCHER_MODULES, backend_configs, backend_names

if TYPE_CHECKING:  # the spec composes the backends' configs from here: it imports this package
    from trainflow.runspec import RunSpec

__all__ = [
    "Allocation",
    "AttemptHandle",
    "AttemptPlan",
    "Launcher",
    "NodeExit",
    "ReleaseReport",
    "backend_configs",
    "backend_names",
    "launcher_for",
    "register",
]

_REGISTRY: dict[str, Callable[[], Launcher]] = {}


def register(name: str) -> Callable:
    def decorate(factory: Callable[[], Launcher]) -> Callable[[], Launcher]:
        _REGISTRY[name] = factory
        return factory

    return decorate


def launcher_for(spec: RunSpec) -> Launcher:
    name = spec.resources.backend.value
    if name in LAUNCHER_MODULES and name not in _REGISTRY:
        importlib.import_module(LAUNCHER_MODULES[name])  # the module registers its launcher
    if name not in _REGISTRY:
        raise ValueError(f"resources.backend: {name!r} is not available in this installation")
    return _REGISTRY[name]()
