"""prepare_image: the environment the workers will use, fingerprinted and checked against the lock."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger

from tasks import lifecycle_task
from trainflow.backends.abilities import BuildsImage
from trainflow.prefect.records import Provisioned, Ready
from trainflow.repro.environment import fingerprint_environment, workload_repo
from trainflow.repro.topology import describe_topology


@lifecycle_task(name="prepare-image")
def prepare_image(provisioned: Provisioned) -> Ready:
    """Refuse to launch in an environment that does not satisfy the lock; record the fingerprint."""
    spec, run, tracker = provisioned.record.spec, provisioned.record.mlflow_run_id, provisioned.tracker
    environment = fingerprint_environment()
    if isinstance(provisioned.launcher, BuildsImage):
        image = provisioned.launcher.prepare_image(spec, provisioned.allocation)
        tracker.set_tags(run, {f"image_{k}": v for k, v in image.items() if v})
    tracker.set_tags(
        run,
        {
            "env_fingerprint": environment.fingerprint,
            "git_commit": environment.git_commit,  # trainflow's own checkout
            "git_dirty": str(environment.git_dirty).lower(),
            "trainflow_git_commit": environment.git_commit,
            "trainflow_git_dirty": str(environment.git_dirty).lower(),
            **workload_repo(Path(spec.workload.entrypoint)).tags(),  # the training script's own repository
            "python_version": environment.python,
            "torch_version": environment.torch,
        },
    )
    tracker.log_json(run, environment.packages, "environment/packages.json")
    tracker.log_text(run, describe_topology(), "environment/topology.txt")
    get_run_logger().info(
        "environment %s (commit %s%s)",
        environment.fingerprint[:12],
        environment.git_commit[:12],
        ", dirty" if environment.git_dirty else "",
    )
    return Ready(provisioned, environment)
