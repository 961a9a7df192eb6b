"""`trainflow render`: the manifests an attempt would create, written out for review or GitOps.

Offline: no cluster, no registry. The status address and token in the worker configs are
placeholders (the orchestrator opens the real channel when it launches an attempt), so are the
values of workload.secret_env (never read here, never written out), and a derived image tag is
computed from the files here without asking whether the registry has it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from trainflow.backends.base import AttemptPlan
from trainflow.backends.kubernetes.config import kubernetes_config
from trainflow.backends.kubernetes.image import context_uri, kaniko_job, planned_image
from trainflow.backends.kubernetes.manifests import attempt_manifests, headless_service
from trainflow.repro.environment import PROJECT_ROOT, git_state
from trainflow.runspec import RunSpec

PLACEHOLDER_TOKEN = "set-by-the-orchestrator-at-launch"
PLACEHOLDER_HOST = "orchestrator.invalid"
PLACEHOLDER_PORT = 7070
PLACEHOLDER_SECRET = "set-by-the-orchestrator-at-launch-from-${}"


def rendered(spec: RunSpec, run_id: str, attempt: int = 1, root: Path = PROJECT_ROOT) -> dict[str, dict]:
    """File name -> manifest, in the order they are applied."""
    image = planned_image(spec, root)
    commit, dirty = git_state(root)
    plan = AttemptPlan(
        attempt=attempt,
        status_address=f"{kubernetes_config(spec).status_host or PLACEHOLDER_HOST}:{PLACEHOLDER_PORT}",
        status_token=PLACEHOLDER_TOKEN,
        code_version=commit[:12] + ("-dirty" if dirty else ""),
        restore_prefix=None,
    )
    placeholders = {name: PLACEHOLDER_SECRET.format(name) for name in spec.workload.secret_env}
    config_secret, workload = attempt_manifests(spec, run_id, plan, image.reference, placeholders)
    files = {"00-service.yaml": headless_service(spec, run_id)}
    if image.derived:
        files["05-image-build-job.yaml"] = kaniko_job(spec, run_id, image, context_uri(spec, image))
    files["10-worker-config.yaml"] = config_secret
    files[f"20-{workload['kind'].lower()}.yaml"] = workload
    return files


HEADERS = {
    "05-image-build-job.yaml": "# Created only when the registry lacks the image, "
    "after the build context is uploaded.\n",
    "10-worker-config.yaml": "# status_address, status_token and secret_env values are placeholders: "
    "the orchestrator sets them at launch.\n",
}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the worker configs) as literal blocks, no anchors: readable in review."""

    def ignore_aliases(self, data) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, text: str):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _string)


def render_attempt(spec: RunSpec, out_dir: Path, run_id: str | None = None, attempt: int = 1) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, doc in rendered(spec, run_id or f"{spec.name}-render", attempt).items():
        path = out_dir / name
        path.write_text(HEADERS.get(name, "") + yaml.dump(doc, Dumper=_Dumper, sort_keys=False))
        written.append(path)
    return written
