"""provision: reserve what the job needs (nodes, ports, scratch) and open the status channel."""

from __future__ import annotations

from prefect import get_run_logger

from tasks import lifecycle_task
from trainflow.backends import launcher_for
from trainflow.backends.abilities import BindsStatusElsewhere
from trainflow.checkpoint.storage import open_storage
from trainflow.home import resolve_checkpoint_uri, runs_root
from trainflow.orchestrator.live import LiveRun
from trainflow.orchestrator.orphans import reap_stale_runs, write_marker
from trainflow.orchestrator.status import StatusServer
from trainflow.prefect.records import Provisioned, RunRecord
from trainflow.reporting.tracking import Tracker


@lifecycle_task(name="provision")
def provision(record: RunRecord, live: LiveRun) -> Provisioned:
    """Reserve the job's resources with its backend and open the run's live parts in `live`; nothing
    runs yet."""
    logger = get_run_logger()
    spec = record.spec
    for reaped in reap_stale_runs():
        logger.warning(
            "reaped run %s: its orchestrator died before teardown (%d process(es) ended)",
            reaped["run_id"],
            reaped["processes"],
        )
    launcher = launcher_for(spec)
    allocation = launcher.provision(spec, record.run_id, runs_root() / record.run_id)
    write_marker(
        allocation.scratch, record.run_id, record.mlflow_run_id, record.tracking_uri, allocation.network_record()
    )
    # bind where the backend says (0.0.0.0 for pods), advertise the address workers can reach
    bind_host = launcher.status_bind_host if isinstance(launcher, BindsStatusElsewhere) else allocation.status_host
    channel = StatusServer(host=bind_host, advertise_host=allocation.status_host)
    storage = open_storage(resolve_checkpoint_uri(spec.checkpoint.uri))
    live.open(launcher, channel, Tracker(record.tracking_uri, spec.tracking.store_patience_s), storage)
    logger.info(
        "provisioned %d %s node(s) x %d process(es); status channel on %s",
        allocation.nodes,
        launcher.name,
        spec.resources.procs_per_node,
        channel.address,
    )
    return Provisioned(record=record, allocation=allocation, live=live)
