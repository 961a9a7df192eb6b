"""finalize: the run's summary, checkpoint index and final figures, recorded in MLflow."""

from __future__ import annotations

from prefect import get_run_logger

from tasks import lifecycle_task
from trainflow.checkpoint.catalog import list_committed, missing_or_resized
from trainflow.checkpoint.storage import Storage, StorageError
from trainflow.contracts import AttemptResult, RunSummary, run_ledger
from trainflow.contracts.summary import resizes_of
from trainflow.orchestrator.failures import Decision
from trainflow.prefect.records import CheckpointRecord, Launched
from trainflow.reporting.diagnosis import diagnose
from trainflow.reporting.figures import summary_metric_rows
from trainflow.reporting.plots import log_run_plots
from trainflow.reporting.summary import run_status


def checkpoint_index(storage: Storage, run_id: str) -> list[dict]:
    """This run's checkpoints still in the store, each checked against its manifest's sizes."""
    return [
        {
            "step": c.step,
            "uri": f"{storage.uri}/{c.prefix}",
            "verified": not missing_or_resized(storage, c),
            "bytes": c.manifest.total_bytes,
            "committed_at": c.manifest.committed_at,
        }
        for c in sorted(list_committed(storage, run_id), key=lambda c: c.step)
    ]


@lifecycle_task(name="finalize")
def finalize(
    last_attempt: Launched, results: list[AttemptResult], decision: Decision, snapshots: list[CheckpointRecord]
) -> dict:
    """Summarise the attempts, index the checkpoints and close the MLflow run."""
    spec, record = last_attempt.spec, last_attempt.record
    status = run_status(results)
    last = results[-1]
    finished = last.finished or {}
    try:
        checkpoints = checkpoint_index(last_attempt.provisioned.storage, record.run_id)
    except StorageError as exc:  # the store is unreachable now: report what the snapshots verified
        get_run_logger().warning("checkpoint index from the snapshots only: %s", exc)
        checkpoints = [
            {"step": c.step, "uri": c.uri, "verified": c.verified, "bytes": c.bytes} for c in snapshots if c.verified
        ]
    ledger = run_ledger(results, spec.world_size)
    stragglers = [s for r in results for s in r.evidence.stragglers]
    summary = RunSummary(
        status=status,
        reason=decision.reason,
        run_id=record.run_id,
        mlflow_run_id=record.mlflow_run_id,
        tracking_uri=record.tracking_uri,
        experiment=record.experiment,
        prefect_flow_run_id=record.prefect_flow_run_id,
        final_step=last.last_step,
        total_steps=spec.workload.steps,
        final_loss=finished.get("loss"),
        params_sha256=finished.get("params_sha256"),
        checkpoints=[{k: c.get(k) for k in ("step", "uri", "verified", "committed_at")} for c in checkpoints],
        snapshots_failed=[s.step for s in snapshots if not s.verified],
        attempts=ledger.attempts,
        resizes=resizes_of(ledger.attempts),
        stragglers=[s.as_dict() for s in stragglers],
        goodput=ledger.figures.goodput,
        features_off=spec.workload.features_off(),  # workload.mode plain: what needs trainflow.runtime
        costs=ledger.figures,
        diagnosis=diagnose(ledger.figures, stragglers),
        plots=[],
    )
    tracker, run = last_attempt.provisioned.tracker, record.mlflow_run_id
    tracker.set_tags(run, {"status": status, "reason": decision.reason[:5000], "params_sha256": summary.params_sha256})
    if summary.resizes:  # each size the job ran at, and why it changed
        tracker.set_tags(
            run,
            {
                "resizes": "; ".join(
                    f"attempt {r.attempt}: world size {r.from_world_size} -> {r.to_world_size} after {r.after}"
                    for r in summary.resizes
                )
            },
        )
    restarts = [(row.attempt, restart) for row in ledger.attempts for restart in row.in_place]
    if restarts:  # each recovery in place: its cause, and the step every rank went back to
        tracker.set_tags(
            run,
            {
                "in_place_restarts": "; ".join(
                    f"attempt {attempt} round {r['round']}: {r['reason']} -> step {r['restored_step']} "
                    f"({r['ranks_kept']} ranks kept, {r['recovery_s']:.2f}s)"
                    for attempt, r in restarts
                )[:5000]
            },
        )
    # the ledger's figures are the run's metrics (summary/...), at its final step, as the summary has them
    figures = {"attempts": len(results), "final_step": summary.final_step, **ledger.figures.model_dump()}
    if summary.final_loss is not None:
        figures["final_loss"] = summary.final_loss
    tracker.log_metrics(run, summary_metric_rows(figures, summary.final_step, last.ended_at))
    tracker.log_json(run, checkpoints, "checkpoints/index.json")
    # what an attempt cost is known once the next one has started: record it on each nested run
    children = tracker.child_runs(run)
    for row in ledger.attempts:
        rows = [
            (key, getattr(row, key), row.attempt, row.ended_at)
            for key in ("recovery_s", "lost_steps")
            if getattr(row, key) is not None
        ]
        if row.in_place:
            rows += [
                ("in_place_restarts", len(row.in_place), row.attempt, row.ended_at),
                ("in_place_recovery_s", sum(r["recovery_s"] for r in row.in_place), row.attempt, row.ended_at),
                ("in_place_ranks_replaced", sum(r["ranks_replaced"] for r in row.in_place), row.attempt, row.ended_at),
            ]
            # each phase summed over the attempt's rounds: abort, rejoin (of which replace), restore
            phases = sorted({name for r in row.in_place for name in r["phases"]})
            rows += [
                (f"in_place_{name}", sum(r["phases"].get(name, 0.0) for r in row.in_place), row.attempt, row.ended_at)
                for name in phases
            ]
        if row.recovery_phases is not None:  # the same split the summary and the drill report show
            rows += [(key, value, row.attempt, row.ended_at) for key, value in row.recovery_phases.as_metrics().items()]
        if str(row.attempt) in children and rows:
            tracker.log_metrics(children[str(row.attempt)], rows)
    tracker.log_text(
        run, "\n".join(f"- {finding}" for finding in summary.diagnosis) or "- nothing to report", "diagnosis.md"
    )
    try:
        summary.plots = log_run_plots(tracker, run, summary)  # plots/timeline.png, plots/goodput.png
    except Exception as exc:  # noqa: BLE001 - pictures are for people, never worth a failed run
        get_run_logger().warning("run pictures not rendered: %s: %s", type(exc).__name__, exc)
    result = summary.as_json_dict()
    tracker.log_json(run, result, "summary.json")
    tracker.end_run(run, "FINISHED" if status == "succeeded" else "FAILED")
    get_run_logger().info("run %s %s%s: %s", record.run_id, status, summary.at_step(), decision.reason)
    return result
