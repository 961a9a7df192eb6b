"""The local backend's capacity check: a node's CPU share, the number of ranks, GPUs."""

from __future__ import annotations

import pytest

from trainflow.backends.local.capacity import local_capacity_problem
from trainflow.runspec import Resources


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        (Resources(nodes=2, cpu=20), "resources.cpu: 20 cores per node, but this machine has 2"),
        (Resources(nodes=5, cpu=2), "resources.cpu: 2 x 5 nodes oversubscribes"),
        (Resources(nodes=2, procs_per_node=64), "resources.procs_per_node: 2 nodes x 64 = 128 ranks"),
        (Resources(nodes=3, procs_per_node=3), "at most 8 (4 per core)"),
    ],
)
def test_more_than_two_cores_can_host_is_refused(resources, field):
    assert field in local_capacity_problem(resources, cores=2)


@pytest.mark.parametrize(
    "resources", [Resources(nodes=2, cpu=1), Resources(nodes=2, cpu=2), Resources(nodes=4, procs_per_node=2)]
)
def test_what_two_cores_can_host_is_accepted(resources):
    assert local_capacity_problem(resources, cores=2) is None


@pytest.mark.parametrize("resources", [Resources(nodes=4, procs_per_node=8), Resources(nodes=8, procs_per_node=8)])
def test_oversubscribe_lets_two_cores_host_many_small_ranks(resources):
    assert "resources.oversubscribe: true" in local_capacity_problem(resources, cores=2)
    assert local_capacity_problem(resources, cores=2, oversubscribe=True) is None


def test_oversubscribe_still_refuses_more_cpu_than_the_machine_has():
    assert "resources.cpu: 20 cores per node" in local_capacity_problem(Resources(cpu=20), cores=2, oversubscribe=True)
