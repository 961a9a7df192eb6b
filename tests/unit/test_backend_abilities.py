"""Each built-in backend offers its optional abilities through the protocols callers test for."""

import pytest

from trainflow.backends import launcher_for
from trainflow.backends.abilities import (
    BindsStatusElsewhere,
    BuildsImage,
    ChecksSpec,
    CutsNodes,
    DumpsStacks,
    PreemptsNodes,
    ProbesNodes,
    RendersManifests,
    ReplacesNodes,
    SharesScratch,
    SignalsRanks,
)
from trainflow.runspec import RunSpec

ABILITIES = (
    ChecksSpec,
    BuildsImage,
    ReplacesNodes,
    ProbesNodes,
    DumpsStacks,
    BindsStatusElsewhere,
    RendersManifests,
    SharesScratch,
    SignalsRanks,
    PreemptsNodes,
    CutsNodes,
)
FAULTS = {SignalsRanks, PreemptsNodes, CutsNodes}


def spec_for(backend: str) -> RunSpec:
    fields = {
        "name": "abilities",
        "workload": {"entrypoint": "examples/digits/train.py", "steps": 10},
        "resources": {"backend": backend, "nodes": 2},
        "checkpoint": {"uri": "s3://bucket/abilities"},
    }
    if backend == "kubernetes":
        fields["kubernetes"] = {"image": "registry.example/trainflow:1"}
    return RunSpec.model_validate(fields)


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ("local", {ChecksSpec, ReplacesNodes, ProbesNodes, DumpsStacks, SharesScratch, *FAULTS}),
        ("slurm", {ChecksSpec, ReplacesNodes, ProbesNodes, DumpsStacks, SharesScratch, *FAULTS}),
        ("kubernetes", {BuildsImage, ReplacesNodes, ProbesNodes, BindsStatusElsewhere, RendersManifests}),
    ],
)
def test_backend_abilities(backend, expected):
    launcher = launcher_for(spec_for(backend))
    assert launcher.name == backend
    assert {ability for ability in ABILITIES if isinstance(launcher, ability)} == expected
