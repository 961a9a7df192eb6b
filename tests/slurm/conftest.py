"""A real Slurm cluster for the Slurm tests, one per session: munged, slurmctld and 3 slurmd, each
slurmd in its own network namespace (trainflow.backends.slurm.local_cluster). It is stopped and its
namespaces removed at the end of the session, whatever the tests did; each test must leave the
queue empty and no job process on the nodes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from trainflow.backends.slurm.local_cluster import LocalCluster
from trainflow.backends.stacks import py_spy_dump
from trainflow.worker_config import JOB_ENV

NODES = 3


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests bring up a cluster in network namespaces: run them as root")
    folder = Path(tempfile.mkdtemp(prefix="tfs-", dir="/tmp"))  # short: munge's socket path is limited
    cluster = LocalCluster(folder, NODES)
    previous = os.environ.get("SLURM_CONF")
    try:
        cluster.up()
        print(f"\nlocal Slurm cluster: {NODES} nodes up in {cluster.started_in_s:.2f}s ({cluster.conf})")
        os.environ.update(cluster.env)
        yield cluster
    finally:
        began = time.monotonic()
        survivors = cluster.down()
        print(f"\nlocal Slurm cluster stopped in {time.monotonic() - began:.2f}s")
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        shutil.rmtree(folder, ignore_errors=True)
        assert not survivors, f"the Slurm cluster left {survivors}"


def queued_jobs(settle_s: float = 60.0) -> list[str]:
    """Jobs Slurm still lists as pending, running or completing, once finished ones had `settle_s`
    to leave the queue (a job completes asynchronously after its last step)."""
    deadline = time.monotonic() + settle_s
    while True:
        result = subprocess.run(
            ["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True, timeout=30, check=True
        )
        jobs = [line for line in result.stdout.splitlines() if line.strip()]
        if not jobs or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)


def slurm_job_processes() -> list[psutil.Process]:
    """Processes of trainflow jobs that Slurm started (other tests' local jobs are not ours)."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if JOB_ENV in env and "SLURM_JOB_ID" in env and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def slurm_env(slurm_cluster, cli_env):
    """A `trainflow` command's environment on the cluster; after the test, the queue must be empty
    and no job process left on any node."""
    yield {**cli_env, **slurm_cluster.env}
    assert queued_jobs() == [], "jobs left in the Slurm queue"
    deadline = time.monotonic() + 60
    while slurm_job_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = slurm_job_processes()
    stacks = "\n".join(f"{who(p)}:\n{py_spy_dump(p.pid)}" for p in left)
    assert left == [], f"job processes left on the nodes:\n{stacks}"


def who(proc: psutil.Process) -> str:
    """Enough of a left process to tell which part of the job it was."""
    try:
        parent = proc.parent()
        return (
            f"pid {proc.pid} {' '.join(proc.cmdline())!r} job {proc.environ().get('SLURM_JOB_ID')} "
            f"parent {parent.pid if parent else None} ({parent.name() if parent else '-'})"
        )
    except psutil.Error:
        return f"pid {proc.pid}"
