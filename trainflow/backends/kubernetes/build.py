"""Building the worker image in the cluster: upload the build context to S3, run Kaniko as a Job,
read the pushed digest from its termination message, clean up whatever happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trainflow.backends.kubernetes.classify import classify_pod
from trainflow.backends.kubernetes.cluster import Cluster, ClusterError
from trainflow.backends.kubernetes.config import kubernetes_config
from trainflow.backends.kubernetes.image import (
    ImageError,
    ImageRef,
    context_files,
    context_tarball,
    context_uri,
    kaniko_job,
    pushed_digest,
)
from trainflow.backends.kubernetes.names import IMAGE_BUILD, LABEL_COMPONENT, RunNames
from trainflow.backends.kubernetes.owner import orchestrator_owner, owned
from trainflow.checkpoint.location import S3Location
from trainflow.contracts import Outcome
from trainflow.runspec import RunSpec

POLL_S = 5.0
LOG_LINES = 40


class S3Objects:
    """Puts and deletes the build context (boto3, configured like the checkpoint store)."""

    def put(self, uri: str, data: bytes) -> None:
        bucket, key = _split(uri)
        _s3().put_object(Bucket=bucket, Key=key, Body=data)

    def delete(self, uri: str) -> None:
        bucket, key = _split(uri)
        _s3().delete_object(Bucket=bucket, Key=key)


def _s3():
    import boto3

    return boto3.client("s3")


def _split(uri: str) -> tuple[str, str]:
    location = S3Location.parse(uri)
    return location.bucket, location.prefix


def build_in_cluster(
    cluster: Cluster,
    spec: RunSpec,
    run_id: str,
    image: ImageRef,
    objects: S3Objects,
    root: Path,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Build `image` from the project at `root` with Kaniko; returns the pushed digest."""
    namespace = kubernetes_config(spec).namespace
    uri = context_uri(spec, image)
    objects.put(uri, context_tarball(root, context_files(root)))
    job = kaniko_job(spec, run_id, image, uri)
    selector = f"{RunNames(run_id).selector()},{LABEL_COMPONENT}={IMAGE_BUILD}"
    try:
        cluster.create(owned(job, orchestrator_owner(namespace)))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for pod in cluster.list("v1", "Pod", namespace, selector):
                digest = pushed_digest(pod)
                if digest:
                    return digest
                verdict = classify_pod(pod, "kaniko")
                if verdict.ended or verdict.outcome == Outcome.USER_ERROR:
                    why = verdict.reason if verdict.exit_code != 0 else "it wrote no digest to its termination message"
                    raise ImageError(f"in-cluster build of {image.reference} failed: {why}\n{_log(cluster, pod)}")
            sleep(POLL_S)
        raise ImageError(f"in-cluster build of {image.reference} did not finish in {timeout_s:.0f}s")
    except ClusterError as exc:
        raise ImageError(f"in-cluster build of {image.reference}: {exc}") from None
    finally:
        try:
            cluster.delete("batch/v1", "Job", namespace, job["metadata"]["name"])
        except ClusterError:
            pass  # release deletes it by label
        try:
            objects.delete(uri)
        except Exception:  # noqa: BLE001 - a leftover context object costs nothing; the build's result matters
            pass


def _log(cluster: Cluster, pod: dict) -> str:
    try:
        return cluster.pod_log(pod["metadata"]["namespace"], pod["metadata"]["name"], "kaniko", LOG_LINES)
    except ClusterError as exc:
        return f"(log unavailable: {exc})"
