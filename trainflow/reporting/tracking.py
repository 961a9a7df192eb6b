"""The one MLflow writer: only the orchestrator records runs, params, metrics and artifacts.

Workers report to the orchestrator, which writes here; a single writer keeps SQLite-backed stores
safe and keeps tracking credentials out of worker processes.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from trainflow.home import artifacts_root, default_tracking_uri
from trainflow.orchestrator.interrupts import signals_deferred
from trainflow.private_files import make_folders, open_private
from trainflow.reporting.tracking_writes import TrackingWrites, metric_name_problem
from trainflow.runspec import RunSpec

PARENT_TAG = "mlflow.parentRunId"
DEFAULT_STORE_PATIENCE_S = 120.0  # as the spec's tracking.store_patience_s
# MLflow 3's UI opens an experiment by its kind: without one it guesses, and may open a training
# experiment on the GenAI overview (traces, evaluations) instead of its runs
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_EXPERIMENT = "custom_model_development"


def tracking_uri_for(spec: RunSpec) -> str:
    return spec.tracking.uri or default_tracking_uri()


def spec_params(spec: RunSpec) -> dict[str, str]:
    """The parallel configuration and the settings that decide what a run computes."""
    r, p, c, f = spec.resources, spec.parallel, spec.checkpoint, spec.fault_tolerance
    return {
        "backend": r.backend.value,
        "nodes": r.nodes,
        "procs_per_node": r.procs_per_node,
        "world_size": spec.world_size,
        "cpu_per_node": r.cpu,
        "memory_per_node": r.memory,
        "gpu_per_node": r.gpu,
        "strategy": p.strategy.value,
        "comm_backend": spec.comm_backend(),
        "dp_degree": p.data,
        "tp_degree": p.tensor,
        "pp_degree": p.pipeline,
        "collective_timeout_s": p.collective_timeout_s,
        "checkpoint_uri": c.uri,
        "checkpoint_every_steps": c.every_steps,
        "checkpoint_keep_last": c.keep_last,
        "max_restarts": f.max_restarts,
        "heartbeat_interval_s": f.heartbeat_interval_s,
        "heartbeat_timeout_s": f.heartbeat_timeout_s,
        "hang_timeout_s": f.hang_timeout_s if f.hang_timeout_s is not None else "auto",
        "preemption_grace_s": f.preemption_grace_s,
        "seed": spec.seed,
        "steps": spec.workload.steps,
        "entrypoint": spec.workload.entrypoint,
        "args": " ".join(spec.workload.args),
    }


def experiment_artifacts(name: str) -> Path:
    """The folder of an experiment's artifacts: always one folder inside the store's artifact root, whatever
    the name says (the spec refuses names that are paths; this holds for any name that reaches here)."""
    root = artifacts_root().resolve()
    folder = (root / name).resolve()
    if folder.parent != root:
        raise ValueError(f"experiment {name[:80]!r}: a name, not a path; its artifacts stay under {root}")
    return folder


@contextmanager
def store_setup(uri: str) -> Iterator[None]:
    """One process at a time sets up a SQLite store: two runs starting together on a new one would
    both create its tables, and the second fails on what the first made."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    make_folders(database.parent)
    with open(open_private(database.with_name(database.name + ".setup-lock"), append=True), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not database.exists():  # 0600; SQLite gives its journal and WAL files the database's mode
                os.close(open_private(database, append=True))
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Tracker:
    """A run's MLflow writes, in order on one writer thread (tracking_writes.py): retried while the
    store refuses them, never raising for a store that is unavailable or a value it cannot take. A
    write returns None (a read its empty answer) when it was dropped; `fault()` says when the store is down."""

    def __init__(self, uri: str, patience_s: float = DEFAULT_STORE_PATIENCE_S):
        self.uri = uri
        # a new SQLite store creates its tables here: half of them breaks it for good
        with signals_deferred(), store_setup(uri):
            self.client = MlflowClient(tracking_uri=uri)
        self._writes = TrackingWrites(patience_s)
        self._refused_metrics: set[str] = set()

    def fault(self) -> str | None:
        """Why the store is down (it refused every write for longer than the patience); None while it works."""
        return self._writes.fault()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for every queued write; False when `timeout_s` ran out first."""
        return self._writes.flush(timeout_s)

    @property
    def dropped_writes(self) -> int:
        """Writes never recorded (the store was down, or refused them)."""
        return self._writes.dropped

    def experiment_id(self, name: str) -> str:
        existing = self.client.get_experiment_by_name(name)
        if existing is not None:
            if EXPERIMENT_KIND_TAG not in existing.tags:  # a kind someone chose is theirs to keep
                self.client.set_experiment_tag(existing.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT)
            return existing.experiment_id
        location = None
        if self.uri.startswith("sqlite:"):
            # A SQLite store would otherwise put artifacts under ./mlruns of whatever the cwd is.
            location = experiment_artifacts(name).as_uri()
        return self.client.create_experiment(
            name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT}
        )

    def start_run(
        self,
        experiment: str,
        run_name: str,
        tags: dict[str, str],
        parent: str | None = None,
        start_time: float | None = None,
    ) -> str | None:
        """A new run; `start_time` (unix seconds): when what it records began, by default now."""
        tags = dict(tags)
        if parent:
            tags[PARENT_TAG] = parent

        def create() -> str:
            start_ms = None if start_time is None else int(start_time * 1000)
            return self.client.create_run(
                self.experiment_id(experiment), run_name=run_name, tags=tags, start_time=start_ms
            ).info.run_id

        return self._writes.call(create, f"run {run_name}")

    def log_params(self, run_id: str | None, params: dict) -> None:
        if run_id:
            batch = [Param(k, str(v)) for k, v in params.items()]
            self._writes.call(lambda: self.client.log_batch(run_id, params=batch), f"params of {run_id}")

    def set_tags(self, run_id: str | None, tags: dict) -> None:
        if run_id:
            batch = [RunTag(k, str(v)) for k, v in tags.items()]
            self._writes.call(lambda: self.client.log_batch(run_id, tags=batch), f"tags {sorted(tags)} of {run_id}")

    def log_metrics(self, run_id: str | None, rows: list[tuple[str, float, int, float]]) -> list[str]:
        """rows of (key, value, step, unix time in seconds), queued: the caller (training's watcher) never
        waits on the store. A metric MLflow cannot take is left out; the names left out for the first
        time are returned, so the caller warns once about each."""
        refused = [k for k in {k for k, _, _, _ in rows} - self._refused_metrics if metric_name_problem(k)]
        self._refused_metrics.update(refused)
        metrics = [Metric(k, float(v), int(t * 1000), int(s)) for k, v, s, t in rows if k not in self._refused_metrics]
        for start in range(0, len(metrics) if run_id else 0, 1000):
            batch = metrics[start : start + 1000]
            self._writes.submit(
                lambda batch=batch: self.client.log_batch(run_id, metrics=batch),
                f"{len(batch)} metric point(s) of {run_id}",
            )
        return refused

    def log_text(self, run_id: str | None, text: str, path: str) -> None:
        if run_id:
            self._writes.call(lambda: self.client.log_text(run_id, text, path), f"artifact {path} of {run_id}")

    def log_json(self, run_id: str | None, data, path: str) -> None:
        self.log_text(run_id, json.dumps(data, indent=2, default=str), path)

    def log_file(self, run_id: str | None, local: Path, folder: str | None = None) -> None:
        if run_id:
            self._writes.call(
                lambda: self.client.log_artifact(run_id, str(local), folder),
                f"artifact {folder or '.'}/{local.name} of {run_id}",
            )

    def child_runs(self, parent_run_id: str) -> dict[str, str]:
        """Nested runs of a run, by their `attempt` tag."""

        def read() -> dict[str, str]:
            parent = self.client.get_run(parent_run_id)
            children = self.client.search_runs(
                [parent.info.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'"
            )
            return {run.data.tags.get("attempt", ""): run.info.run_id for run in children}

        return self._writes.call(read, f"the nested runs of {parent_run_id}") or {}

    def end_run(self, run_id: str | None, status: str, end_time: float | None = None) -> None:
        """End a run; `end_time` (unix seconds): when what it records ended, by default now."""
        if run_id:
            end_ms = None if end_time is None else int(end_time * 1000)
            self._writes.call(
                lambda: self.client.set_terminated(run_id, status=status, end_time=end_ms), f"the end of {run_id}"
            )

    def run_status(self, run_id: str) -> str:
        """RUNNING, FINISHED, FAILED or KILLED; UNKNOWN when the store does not answer."""
        return (
            self._writes.call(lambda: self.client.get_run(run_id).info.status, f"the status of {run_id}") or "UNKNOWN"
        )

    def end_running(self, experiment: str, filter_string: str, status: str) -> list[str]:
        """End the runs of `experiment` matching `filter_string` that are still RUNNING; their ids."""

        def end() -> list[str]:
            found = self.client.get_experiment_by_name(experiment)
            if found is None:
                return []
            running = self.client.search_runs(
                [found.experiment_id], filter_string=f"{filter_string} and attributes.status = 'RUNNING'"
            )
            for run in running:
                self.client.set_terminated(run.info.run_id, status=status)
            return [run.info.run_id for run in running]

        return self._writes.call(end, f"the open runs of {experiment}") or []
