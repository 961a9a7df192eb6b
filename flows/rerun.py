"""Rerun an earlier training run exactly: its recorded spec and seed, checked against its code and
environment, as a new MLflow run tagged rerun_of=<the original's run id>.

    load the recorded run -> check drift (refuse unless allowed) -> training lifecycle (subflow)

Run it with `trainflow rerun MLFLOW_RUN_ID`, from the `rerun` deployment, or directly:
`python -m flows.rerun MLFLOW_RUN_ID`.
"""

from __future__ import annotations

import sys

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, Failed
from pydantic import Field

from flows.lifecycle import training_lifecycle
from trainflow.home import default_tracking_uri
from trainflow.prefect.run_names import given_or
from trainflow.prefect.verdicts import publish_rerun
from trainflow.repro.rerun import Lineage, RecordedRun, check_rerun, load_recorded_run, refusal, rerunning


@task(name="load-recorded-run", cache_policy=NO_CACHE, persist_result=False)
def load_recorded(mlflow_run_id: str, tracking_uri: str) -> RecordedRun:
    """The spec, seed, code commit and environment fingerprint the run recorded."""
    recorded = load_recorded_run(mlflow_run_id, tracking_uri)
    get_run_logger().info(
        "run %s (%s): spec %s, seed %d, commit %s, environment %s",
        mlflow_run_id,
        recorded.run_name,
        recorded.spec.name,
        recorded.spec.seed,
        recorded.tags["git_commit"][:12],
        recorded.tags["env_fingerprint"][:12],
    )
    return recorded


@task(name="check-drift", cache_policy=NO_CACHE, persist_result=False)
def check_drift(recorded: RecordedRun) -> list[str]:
    """How the code and environment here differ from the recorded run's."""
    drift = check_rerun(recorded)
    for line in drift:
        get_run_logger().warning("drift: %s", line)
    return drift


@flow(name="rerun", flow_run_name=given_or("rerun-{mlflow_run_id}"))
def rerun_training(
    mlflow_run_id: str = Field(
        pattern=r"^[0-9a-f]{32}$",
        title="MLflow run id",
        description="The run to repeat (MLflow's run id, 32 hex digits).",
    ),
    allow_drift: bool = Field(
        default=False,
        title="Allow drift",
        description="Run even if the code or environment differ from the recorded run; the drift is recorded.",
    ),
    tracking_uri: str | None = Field(
        default=None,
        title="MLflow tracking URI",
        description="Where the run is recorded. Default: sqlite:///$TRAINFLOW_HOME/mlflow.db.",
    ),
):
    """Repeat a recorded run with the same spec and seed, refusing when code or environment drifted."""
    recorded = load_recorded(mlflow_run_id, tracking_uri or default_tracking_uri())
    drift = check_drift(recorded)
    if drift and not allow_drift:
        message = refusal(recorded, drift)
        return Failed(message=message, data={"status": "refused", "reason": message, "drift": drift})
    with rerunning(Lineage(rerun_of=mlflow_run_id, drift=tuple(drift), allow_drift=allow_drift)):
        state = training_lifecycle(recorded.spec, return_state=True)
    summary = state.result(raise_on_failure=False)
    if not isinstance(summary, dict):
        return Failed(message=f"the training lifecycle crashed: {state.message}")
    summary.update(rerun_of=mlflow_run_id, drift=drift, original_params_sha256=recorded.params_sha256)
    verdict = publish_rerun(summary)  # drift or none, and the parameters against the original's
    if verdict:
        get_run_logger().info("rerun of %s: %s", mlflow_run_id, verdict["verdict"])
    final = Completed if summary["status"] == "succeeded" else Failed
    return final(message=f"{state.message}; {verdict['verdict']}" if verdict else state.message, data=summary)


if __name__ == "__main__":
    rerun_training(sys.argv[1], allow_drift="--allow-drift" in sys.argv[2:])
