"""Names and labels of everything a run creates in the cluster, derived from the run id alone.

Every object carries the run label, so teardown finds it by label even after the orchestrator
restarts; attempt objects also carry the attempt label. Names are DNS labels short enough that
the longest name a pod gets (a JobSet pod's hostname) stays within 63 characters.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

MANAGED_BY = "trainflow"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RUN = "trainflow.dev/run"
LABEL_ATTEMPT = "trainflow.dev/attempt"
LABEL_COMPONENT = "trainflow.dev/component"
ANNOTATION_RUN_ID = "trainflow.dev/run-id"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

WORKERS = "workers"
RENDEZVOUS = "rendezvous"
WORKER_CONFIG = "worker-config"
IMAGE_BUILD = "image-build"

BASE_MAX = 40  # leaves room for "-a101-node-0-1023" in JobSet pod hostnames


def dns_label(text: str, limit: int = BASE_MAX) -> str:
    """`text` as a DNS-1123 label of at most `limit` characters; long ones end in a short hash."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "run"
    if len(label) <= limit:
        return label
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{label[: limit - 7].rstrip('-')}-{digest}"


@dataclass(frozen=True)
class RunNames:
    run_id: str

    @property
    def base(self) -> str:
        return dns_label(self.run_id)

    @property
    def service(self) -> str:
        return self.base

    def workload(self, attempt: int) -> str:
        return f"{self.base}-a{attempt}"

    def config(self, attempt: int) -> str:
        return f"{self.base}-a{attempt}-config"

    def image_build(self) -> str:
        return f"{self.base}-image-build"

    def labels(self, component: str, attempt: int | None = None) -> dict[str, str]:
        labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_RUN: self.base, LABEL_COMPONENT: component}
        if attempt is not None:
            labels[LABEL_ATTEMPT] = str(attempt)
        return labels

    def annotations(self) -> dict[str, str]:
        return {ANNOTATION_RUN_ID: self.run_id}

    def selector(self, attempt: int | None = None) -> str:
        """Label selector of everything of this run, or of one attempt."""
        selector = f"{LABEL_RUN}={self.base}"
        return selector if attempt is None else f"{selector},{LABEL_ATTEMPT}={attempt}"
