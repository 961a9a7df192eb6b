"""What a dead orchestrator left behind: scratch folders, network namespaces, a RUNNING MLflow run.

Every lifecycle run writes `runs/<run id>/orchestrator.json` (its pid, its MLflow run, its network
namespaces). A later run reaps any whose orchestrator is gone: its workers stop by themselves once
the status channel is unreachable, and this clears the rest and records what happened.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psutil

from trainflow.backends.job_tmp import remove_job_temp_dir
from trainflow.backends.processes import job_processes, terminate
from trainflow.backends.shared_copies import remove_recorded
from trainflow.home import runs_root
from trainflow.private_files import private_folder, write_private

MARKER = "orchestrator.json"


def write_marker(scratch: Path, run_id: str, mlflow_run_id: str, tracking_uri: str, network: dict | None) -> None:
    private_folder(scratch)
    proc = psutil.Process()
    write_private(
        scratch / MARKER,
        json.dumps(
            {
                "run_id": run_id,
                "pid": proc.pid,
                "pid_started": proc.create_time(),
                "mlflow_run_id": mlflow_run_id,
                "tracking_uri": tracking_uri,
                "network": network,
            }
        ),
    )


def _orchestrator_alive(marker: dict) -> bool:
    try:
        return abs(psutil.Process(marker["pid"]).create_time() - marker["pid_started"]) < 1.0
    except (psutil.Error, KeyError):
        return False


def reap_stale_runs(root: Path | None = None) -> list[dict]:
    """Clean up after orchestrators that died without teardown; returns what was reaped."""
    reaped = []
    root = root or runs_root()
    for marker_path in sorted(root.glob(f"*/{MARKER}")):
        try:
            marker = json.loads(marker_path.read_text())
        except (OSError, ValueError):
            continue
        if _orchestrator_alive(marker):
            continue
        stopped = _clear(marker["run_id"], marker_path.parent, marker.get("network"))
        _mark_failed(marker)
        reaped.append({"run_id": marker["run_id"], "processes": stopped})
    return reaped


def clear_unprovisioned(run_id: str, root: Path | None = None) -> dict:
    """Release what a run's provision had reserved when it was stopped before returning it: the
    processes, network namespaces and scratch folder of `run_id`. Returns a teardown report."""
    scratch = (root or runs_root()) / run_id
    try:
        network = json.loads((scratch / MARKER).read_text()).get("network")
    except (OSError, ValueError):
        network = None
    existed = scratch.exists()
    stopped = _clear(run_id, scratch, network)
    survivors = [f"{scratch} could not be removed"] if scratch.exists() else []
    return {
        "stopped_processes": stopped,
        "released_ports": [],
        "removed_paths": [str(scratch)] if existed else [],
        "survivors": survivors,
        "clean": not survivors,
    }


def _clear(run_id: str, scratch: Path, network: dict | None) -> int:
    leftovers = job_processes(run_id)
    if leftovers:
        terminate(leftovers, grace_s=2.0)
    if network:
        from trainflow.backends.netns import NodeNetwork

        NodeNetwork.from_record(network).destroy()
    remove_job_temp_dir(scratch)
    remove_recorded(scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    return len(leftovers)


def _mark_failed(marker: dict) -> None:
    """The dead run FAILED, and its attempt cut short (a nested run) KILLED, as teardown would have."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from trainflow.reporting.tracking import PARENT_TAG

    try:
        client = MlflowClient(marker["tracking_uri"])
        run = client.get_run(marker["mlflow_run_id"])
        attempts = client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{run.info.run_id}' and attributes.status = 'RUNNING'",
        )
        for attempt in attempts:
            client.set_tag(attempt.info.run_id, "reason", "the orchestrator died during this attempt")
            client.set_terminated(attempt.info.run_id, status="KILLED")
        if run.info.status == "RUNNING":
            client.set_tag(run.info.run_id, "status", "failed")
            client.set_tag(run.info.run_id, "reason", "the orchestrator died before teardown; reaped by a later run")
            client.set_terminated(run.info.run_id, status="FAILED")
    except MlflowException:
        pass
