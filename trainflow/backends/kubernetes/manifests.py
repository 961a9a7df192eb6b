"""The manifests of a run: its headless Service (once per run) and, per attempt, the Secret of
worker configs (they hold the status token) and secret_env values, and the workload. Plain dicts,
the same ones `trainflow render` writes out."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

from trainflow.backends.base import AttemptPlan
from trainflow.backends.kubernetes.config import kubernetes_config
from trainflow.backends.kubernetes.names import LABEL_COMPONENT, LABEL_RUN, RENDEZVOUS, WORKER_CONFIG, WORKERS, RunNames
from trainflow.backends.kubernetes.pod import (
    NODE_SCRATCH_DIR,
    RENDEZVOUS_PORT,
    SCRATCH_DIR,
    SECRET_ENV_KEY,
    config_keys,
)
from trainflow.backends.kubernetes.workloads import Attempt, workload
from trainflow.backends.worker import worker_config
from trainflow.runspec import RunSpec
from trainflow.worker_config import WorkerConfig


def headless_service(spec: RunSpec, run_id: str) -> dict:
    """Gives every worker pod of the run a stable DNS name, `<hostname>.<service>`, for rendezvous."""
    names = RunNames(run_id)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service,
            "namespace": kubernetes_config(spec).namespace,
            "labels": names.labels(RENDEZVOUS),
            "annotations": names.annotations(),
        },
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_RUN: names.base, LABEL_COMPONENT: WORKERS},
            # the rendezvous host must resolve before its pod is Ready: it becomes ready by rendezvousing
            "publishNotReadyAddresses": True,
            "ports": [
                {"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT, "protocol": "TCP"}
            ],
        },
    }


def worker_configs(spec: RunSpec, run_id: str, plan: AttemptPlan) -> dict[str, str]:
    """Secret key -> the worker config JSON of that node (the local backend's file, verbatim)."""
    keys = config_keys(kubernetes_config(spec).launch_api, spec.resources.nodes)
    return {
        key: json.dumps(dataclasses.asdict(pod_worker_config(spec, run_id, plan, node)), indent=1)
        for key, node in keys.items()
    }


def pod_worker_config(spec: RunSpec, run_id: str, plan: AttemptPlan, node: int) -> WorkerConfig:
    config = worker_config(spec, run_id, plan, node, Path(NODE_SCRATCH_DIR))
    return dataclasses.replace(config, scratch_volume=SCRATCH_DIR)


def worker_config_secret(spec: RunSpec, run_id: str, plan: AttemptPlan, secret_env: Mapping[str, str]) -> dict:
    """The attempt's worker configs, and the values of `secret_env` for the pods' environment."""
    names = RunNames(run_id)
    values = {SECRET_ENV_KEY.format(name=name): value for name, value in secret_env.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": names.config(plan.attempt),
            "namespace": kubernetes_config(spec).namespace,
            "labels": names.labels(WORKER_CONFIG, plan.attempt),
            "annotations": names.annotations(),
        },
        "immutable": True,
        "stringData": {**worker_configs(spec, run_id, plan), **values},
    }


def attempt_manifests(
    spec: RunSpec, run_id: str, plan: AttemptPlan, image: str, secret_env: Mapping[str, str] | None = None
) -> list[dict]:
    """What launching attempt `plan.attempt` creates, in creation order (config before pods);
    `secret_env` has a value for every name of workload.secret_env."""
    secret_env = secret_env or {}
    missing = [name for name in spec.workload.secret_env if name not in secret_env]
    if missing:
        raise ValueError(f"no value for workload.secret_env {', '.join(missing)}")
    return [worker_config_secret(spec, run_id, plan, secret_env), workload(Attempt(spec, run_id, plan.attempt, image))]
