"""teardown: release everything the run held, whatever happened, and check that it is gone."""

from __future__ import annotations

from prefect import get_run_logger

from tasks import lifecycle_task
from tasks.records import Provisioned, RunRecord
from trainflow.tracking import Tracker


@lifecycle_task(name="teardown")
def teardown(record: RunRecord, provisioned: Provisioned | None, finalized: bool) -> dict:
    """Stop every process of the job, free its ports and scratch, close the status channel, and
    report what was released and anything that survived."""
    logger = get_run_logger()
    report: dict = {"stopped_processes": 0, "released_ports": [], "removed_paths": [], "survivors": [], "clean": True}
    tracker = provisioned.tracker if provisioned else Tracker(record.tracking_uri)
    if provisioned is not None:
        provisioned.channel.close()
        report = provisioned.launcher.release(provisioned.allocation).as_dict()
        report["status_channel_closed"] = True
    tracker.log_json(record.mlflow_run_id, report, "teardown.json")
    tracker.set_tags(record.mlflow_run_id, {"teardown_clean": str(report["clean"]).lower()})
    if not finalized:
        tracker.set_tags(record.mlflow_run_id, {"status": "failed", "reason": "the lifecycle stopped before finalize"})
        tracker.end_run(record.mlflow_run_id, "FAILED")
    if report["clean"]:
        logger.info(
            "teardown: %d process(es) stopped, ports %s released, %d path(s) removed",
            report["stopped_processes"], report["released_ports"], len(report["removed_paths"]),
        )
    else:
        logger.error("teardown left survivors: %s", "; ".join(report["survivors"]))
    return report
