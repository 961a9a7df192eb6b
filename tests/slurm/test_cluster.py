"""The test cluster itself: several hosts with their own addresses under one real scheduler."""

from __future__ import annotations

import subprocess

import pytest

from tests.slurm.conftest import NODES, queued_jobs

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_one_job_step_spans_every_node_each_with_its_own_host_and_address(slurm_cluster):
    result = subprocess.run(
        ["srun", f"--nodes={NODES}", "--ntasks-per-node=1", "sh", "-c", 'echo "$(hostname) $(hostname -i)"'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    hosts = dict(line.split() for line in result.stdout.splitlines())
    assert sorted(hosts) == slurm_cluster.node_names
    assert len(set(hosts.values())) == NODES
    assert all(address.startswith("10.") for address in hosts.values())
    assert queued_jobs() == []
