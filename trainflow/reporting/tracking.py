"""The one MLflow writer: only the orchestrator records runs, params, metrics and artifacts.

Workers report to the orchestrator, which writes here; a single writer keeps SQLite-backed stores
safe and keeps tracking credentials out of worker processes.
"""

from __future__ import annotations

import fcntl
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from trainflow.home import artifacts_root, default_tracking_uri
from trainflow.orchestrator.interrupts import signals_deferred
from trainflow.spec import RunSpec

PARENT_TAG = "mlflow.parentRunId"
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


@contextmanager
def store_setup(uri: str) -> Iterator[None]:
    """One process at a time sets up a SQLite store: two runs starting together on a new one would
    both create its tables, and the second fails on what the first made."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.with_name(database.name + ".setup-lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Tracker:
    def __init__(self, uri: str):
        self.uri = uri
        # a new SQLite store creates its tables here: half of them breaks it for good
        with signals_deferred(), store_setup(uri):
            self.client = MlflowClient(tracking_uri=uri)
        self._lock = threading.Lock()

    def experiment_id(self, name: str) -> str:
        existing = self.client.get_experiment_by_name(name)
        if existing is not None:
            if EXPERIMENT_KIND_TAG not in existing.tags:  # a kind someone chose is theirs to keep
                self.client.set_experiment_tag(existing.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT)
            return existing.experiment_id
        location = None
        if self.uri.startswith("sqlite:"):
            # A SQLite store would otherwise put artifacts under ./mlruns of whatever the cwd is.
            location = (artifacts_root() / name).as_uri()
        return self.client.create_experiment(name, artifact_location=location,
                                             tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT})

    def start_run(self, experiment: str, run_name: str, tags: dict[str, str], parent: str | None = None,
                  start_time: float | None = None) -> str:
        """A new run; `start_time` (unix seconds): when what it records began, by default now."""
        tags = dict(tags)
        if parent:
            tags[PARENT_TAG] = parent
        with self._lock:
            run = self.client.create_run(self.experiment_id(experiment), run_name=run_name, tags=tags,
                                         start_time=None if start_time is None else int(start_time * 1000))
        return run.info.run_id

    def log_params(self, run_id: str, params: dict) -> None:
        with self._lock:
            self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def set_tags(self, run_id: str, tags: dict) -> None:
        with self._lock:
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, run_id: str, rows: list[tuple[str, float, int, float]]) -> None:
        """rows of (key, value, step, unix time in seconds)."""
        metrics = [Metric(k, float(v), int(t * 1000), int(s)) for k, v, s, t in rows]
        with self._lock:
            for start in range(0, len(metrics), 1000):
                self.client.log_batch(run_id, metrics=metrics[start : start + 1000])

    def log_text(self, run_id: str, text: str, path: str) -> None:
        with self._lock:
            self.client.log_text(run_id, text, path)

    def log_json(self, run_id: str, data, path: str) -> None:
        self.log_text(run_id, json.dumps(data, indent=2, default=str), path)

    def log_file(self, run_id: str, local: Path, folder: str | None = None) -> None:
        with self._lock:
            self.client.log_artifact(run_id, str(local), folder)

    def child_runs(self, parent_run_id: str) -> dict[str, str]:
        """Nested runs of a run, by their `attempt` tag."""
        with self._lock:
            parent = self.client.get_run(parent_run_id)
            children = self.client.search_runs(
                [parent.info.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'"
            )
        return {run.data.tags.get("attempt", ""): run.info.run_id for run in children}

    def end_run(self, run_id: str, status: str, end_time: float | None = None) -> None:
        """End a run; `end_time` (unix seconds): when what it records ended, by default now."""
        with self._lock:
            self.client.set_terminated(run_id, status=status,
                                       end_time=None if end_time is None else int(end_time * 1000))

    def run_status(self, run_id: str) -> str:
        """RUNNING, FINISHED, FAILED or KILLED."""
        with self._lock:
            return self.client.get_run(run_id).info.status

    def end_running(self, experiment: str, filter_string: str, status: str) -> list[str]:
        """End the runs of `experiment` matching `filter_string` that are still RUNNING; their ids."""
        with self._lock:
            found = self.client.get_experiment_by_name(experiment)
            if found is None:
                return []
            running = self.client.search_runs(
                [found.experiment_id], filter_string=f"{filter_string} and attributes.status = 'RUNNING'"
            )
            for run in running:
                self.client.set_terminated(run.info.run_id, status=status)
        return [run.info.run_id for run in running]
