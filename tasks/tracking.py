"""start_tracking: the lifecycle's MLflow run, with the parallel configuration and the spec."""

from __future__ import annotations

import time

from prefect import get_run_logger
from prefect.runtime import deployment, flow_run

from tasks import lifecycle_task
from trainflow.prefect.records import RunRecord
from trainflow.prefect.run_names import name_for_run_id
from trainflow.reporting.audit import origin_tags
from trainflow.reporting.tracking import Tracker, spec_params, tracking_uri_for
from trainflow.repro.rerun import DRIFT_ARTIFACT, code_snapshot, current_lineage
from trainflow.runspec import RunSpec


def deployment_name() -> str | None:
    """The Prefect deployment this flow run (or the flow run it is a subflow of) was started from."""
    try:
        if deployment.name:
            return deployment.name
        parent = flow_run.parent_deployment_id  # a lifecycle inside a deployment's rerun flow
        if not parent:
            return None
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            return client.read_deployment(parent).name
    except Exception as exc:  # noqa: BLE001 - the audit tags say "flow" rather than fail the run
        get_run_logger().warning("could not read the flow run's deployment: %s: %s", type(exc).__name__, exc)
        return None


def name_flow_run(flow_run_id: str, run_id: str) -> None:
    """Name the flow run after the trainflow run id, so runs of one spec can be told apart in the
    Prefect UI; a name a person gave it stays, with the run id as a tag (trainflow/prefect/run_names.py)."""
    try:
        get_run_logger().debug("flow run %s", name_for_run_id(flow_run_id, run_id))
    except Exception as exc:  # noqa: BLE001 - a name is for people, never worth a failed run
        get_run_logger().warning("flow run not named after %s: %s: %s", run_id, type(exc).__name__, exc)


@lifecycle_task(name="start-tracking")
def start_tracking(spec: RunSpec, resume: bool, run_id: str) -> RunRecord:
    """Open the MLflow run of this lifecycle (tagged with `run_id`) and record what it will compute."""
    uri = tracking_uri_for(spec)
    tracker = Tracker(uri, spec.tracking.store_patience_s)
    experiment = spec.tracking.experiment or spec.name
    flow_run_id = str(flow_run.id or "")
    if flow_run_id:
        name_flow_run(flow_run_id, run_id)
    lineage = current_lineage()  # set when this run reruns an earlier one
    mlflow_run_id = tracker.start_run(
        experiment,
        run_name=run_id,
        tags={
            **spec.tracking.tags,  # owner, team: who the device-hours belong to
            "trainflow.run_id": run_id,
            "spec_hash": spec.spec_hash(),
            "prefect_flow_run_id": flow_run_id,
            "resume": str(resume).lower(),
            "workload_mode": spec.workload.mode.value,
            "features_off": ",".join(spec.workload.features_off()) or "none",
            **code_snapshot(spec),  # what a rerun compares besides the environment fingerprint
            **(lineage.tags() if lineage else {}),
            **origin_tags(deployment_name()),  # who launched it, from where (trainflow audit)
        },
    )
    if mlflow_run_id is None:  # nothing is provisioned yet: a run that cannot be recorded does not start
        raise RuntimeError(f"the tracking store {uri} takes no writes: {tracker.fault() or 'see the log above'}")
    tracker.log_params(mlflow_run_id, spec_params(spec))
    tracker.log_text(mlflow_run_id, spec.to_yaml(), "spec/resolved_spec.yaml")
    if lineage and lineage.drift:
        tracker.log_json(mlflow_run_id, list(lineage.drift), DRIFT_ARTIFACT)
    return RunRecord(
        spec=spec,
        run_id=run_id,
        mlflow_run_id=mlflow_run_id,
        tracking_uri=uri,
        experiment=experiment,
        prefect_flow_run_id=flow_run_id,
        started_at=time.time(),
    )
