"""The worker image: named by what is in it, built in the cluster when the registry lacks it.

`kubernetes.image` with a tag or digest is used as is. A bare repository gets the tag
`tf-<hash>`: a hash of the Dockerfile's torch variant and of every file of the build context
(what git sees: tracked and unignored files, minus tests and notebooks; `requirements.lock`
among them), so the same lock file and code always name the same image and any change names a
new one. When that tag is missing, a Kaniko Job builds `infra/Dockerfile` from the context
uploaded to the run's S3 bucket and writes the pushed digest to its termination message.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from trainflow.backends.kubernetes.config import kubernetes_config
from trainflow.backends.kubernetes.names import IMAGE_BUILD, RunNames
from trainflow.checkpoint.location import S3Location
from trainflow.repro.environment import PROJECT_ROOT, git_state
from trainflow.runspec import RunSpec

DOCKERFILE = "infra/Dockerfile"
KANIKO_IMAGE = os.environ.get("TRAINFLOW_KANIKO_IMAGE", "gcr.io/kaniko-project/executor:v1.23.2")
CONTEXT_EXCLUDED = ("tests/", "notebooks/", ".git/", ".github/", ".ci/")  # mirrored by infra/Dockerfile.dockerignore
BUILD_PREFIX = "_trainflow/build"
NOT_CONTEXT_PARTS = {".git", ".venv", ".trainflow", ".pytest_cache", "__pycache__", "build"}


class ImageError(RuntimeError):
    """The worker image cannot be found or built."""


@dataclass(frozen=True)
class ImageRef:
    repository: str
    tag: str | None = None
    digest: str | None = None
    derived: bool = False  # the tag was derived from the lock file and code (and may need building)

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        name, _, digest = text.partition("@")
        repository, tag = name, None
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            repository, tag = name.rsplit(":", 1)
        return cls(repository, tag, digest or None)

    @property
    def pinned(self) -> bool:
        """Given with a tag or digest: used as is, never built."""
        return bool(self.tag or self.digest)

    @property
    def reference(self) -> str:
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag}" if self.tag else self.repository

    def with_digest(self, digest: str) -> ImageRef:
        return ImageRef(self.repository, self.tag, digest, self.derived)


def torch_variant(spec: RunSpec) -> str:
    return "cuda" if spec.resources.gpu else "cpu"


def context_files(root: Path = PROJECT_ROOT) -> list[str]:
    """Paths (relative to root) of the build context: what git sees, minus what no worker needs."""
    try:
        listed = (
            subprocess.run(
                ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                capture_output=True,
                check=True,
                timeout=30,
            )
            .stdout.decode()
            .split("\0")
        )
    except (OSError, subprocess.SubprocessError):
        # no git (inside the image itself): the files there are the context it was built from
        listed = [
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and p.suffix != ".pyc" and not NOT_CONTEXT_PARTS & set(p.relative_to(root).parts)
        ]
    files = {p for p in listed if p and not p.startswith(CONTEXT_EXCLUDED) and (root / p).is_file()}
    missing = [required for required in ("requirements.lock", DOCKERFILE) if required not in files]
    if missing:
        raise ImageError(f"the build context lacks {', '.join(missing)} (looked in {root})")
    return sorted(files)


def derived_tag(root: Path, files: list[str], variant: str) -> str:
    digest = hashlib.sha256(f"variant={variant}\n".encode())
    for path in files:
        digest.update(f"{path}\0{hashlib.sha256((root / path).read_bytes()).hexdigest()}\n".encode())
    return f"tf-{variant}-{digest.hexdigest()[:20]}"


def planned_image(spec: RunSpec, root: Path = PROJECT_ROOT) -> ImageRef:
    """The image the spec's pods run; a bare repository gets the tag derived from lock and code."""
    image = ImageRef.parse(kubernetes_config(spec).image or "")
    if image.pinned:
        return image
    return ImageRef(image.repository, derived_tag(root, context_files(root), torch_variant(spec)), derived=True)


def context_tarball(root: Path, files: list[str]) -> bytes:
    """The build context as a reproducible .tar.gz (sorted, no timestamps or owners)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path in files:
            data = (root / path).read_bytes()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o755 if os.access(root / path, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def context_uri(spec: RunSpec, image: ImageRef) -> str:
    """Where the build context goes: the checkpoint bucket, outside any run's checkpoints."""
    bucket = S3Location.parse(spec.checkpoint.uri).bucket
    return f"s3://{bucket}/{BUILD_PREFIX}/{image.tag}.tar.gz"


def kaniko_job(spec: RunSpec, run_id: str, image: ImageRef, context: str) -> dict:
    """A Job that builds infra/Dockerfile from `context` and pushes `image`; the pushed digest ends
    up as the container's termination message."""
    names = RunNames(run_id)
    k8s = kubernetes_config(spec)
    container: dict = {
        "name": "kaniko",
        "image": KANIKO_IMAGE,
        "args": [
            f"--context={context}",
            f"--dockerfile={DOCKERFILE}",
            f"--destination={image.reference}",
            f"--build-arg=TORCH_VARIANT={torch_variant(spec)}",
            f"--build-arg=GIT_COMMIT={git_state()[0]}",
            "--digest-file=/dev/termination-log",
            "--snapshot-mode=redo",
        ],
        "env": [],
        "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
    }
    if k8s.s3_secret:  # Kaniko reads a custom S3 endpoint from S3_ENDPOINT
        endpoint = {"name": k8s.s3_secret, "key": "AWS_ENDPOINT_URL_S3", "optional": True}
        container["env"].append({"name": "S3_ENDPOINT", "valueFrom": {"secretKeyRef": endpoint}})
    if os.environ.get("AWS_ENDPOINT_URL_S3"):
        container["env"].append({"name": "S3_FORCE_PATH_STYLE", "value": "true"})  # S3-compatible stores
    if k8s.s3_secret:
        container["envFrom"] = [{"secretRef": {"name": k8s.s3_secret}}]
    pod: dict = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [container],
    }
    if k8s.service_account:
        pod["serviceAccountName"] = k8s.service_account
    if k8s.registry_secret:
        container["volumeMounts"] = [{"name": "registry-credentials", "mountPath": "/kaniko/.docker", "readOnly": True}]
        pod["volumes"] = [
            {
                "name": "registry-credentials",
                "secret": {
                    "secretName": k8s.registry_secret,
                    "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                },
            }
        ]
    labels = names.labels(IMAGE_BUILD)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names.image_build(),
            "namespace": k8s.namespace,
            "labels": labels,
            "annotations": {**names.annotations(), "trainflow.dev/image": image.reference},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 3600,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def pushed_digest(pod: dict) -> str | None:
    """The digest Kaniko wrote to its termination message, once the build pod succeeded."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        message = (terminated.get("message") or "").strip()
        if terminated.get("exitCode") == 0 and message.startswith("sha256:") and len(message) == 71:
            return message
    return None
