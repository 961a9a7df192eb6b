"""The built-in backends by name: each one's launcher module and its own spec section.

The only place that names them. Modules are imported by their path, so nothing else names a
backend; a config module imports only `trainflow.section`, so the spec can compose the config
models while it is being defined (the launchers, which import the spec, come later, when chosen).
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainflow.section import BackendConfig

LAUNCHER_MODULES = {
    "local": "trainflow.backends.local.launcher",
    "kubernetes": "trainflow.backends.kubernetes.launcher",
    "slurm": "trainflow.backends.slurm.launcher",
}
_CONFIGS = {
    "local": "trainflow.backends.local.config:LocalConfig",
    "kubernetes": "trainflow.backends.kubernetes.config:KubernetesConfig",
    "slurm": "trainflow.backends.slurm.config:SlurmConfig",
}


def backend_names() -> list[str]:
    return list(_CONFIGS)


@cache
def backend_configs() -> dict[str, type[BackendConfig]]:
    """Each backend's config model, keyed by the backend's name (its discriminator)."""
    configs = {}
    for name, target in _CONFIGS.items():
        module, _, cls = target.partition(":")
        configs[name] = getattr(importlib.import_module(module), cls)
    return configs
