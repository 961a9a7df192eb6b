"""Reproducible reruns: what a run recorded about itself, and how this checkout differs from it.

A run records its resolved spec (artifact spec/resolved_spec.yaml, seed included), the code it ran
(git commit, whether the tree was dirty and a hash of the uncommitted changes, a hash of the
training script) and its environment (fingerprint, Python, platform, lock file, every installed
package). A rerun loads exactly that spec, refused when it is not the spec the run ran (its hash
and the params the run recorded as it started), and refuses to start when the code or the environment
here differ from the record, listing each difference, unless the drift is accepted; the new run
is then tagged with what it reran and the drift it accepted.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import platform
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainflow.repro.environment import PROJECT_ROOT, Environment, fingerprint_environment, lock_path
from trainflow.runspec import RunSpec, SpecError, parse_spec

SPEC_ARTIFACT = "spec/resolved_spec.yaml"
PACKAGES_ARTIFACT = "environment/packages.json"
DRIFT_ARTIFACT = "rerun/drift.json"
SHOWN_PACKAGES = 10  # package differences listed one by one before the rest are counted
MLFLOW_PARAM_LENGTH = 6000  # MLflow keeps the first 6000 characters of a longer param
CODE_PATHS = ["*.py", "requirements.lock", "pyproject.toml", ":!tests/"]  # what computes a run: not docs, not tests


class RerunError(ValueError):
    """A rerun that cannot start: the run is unknown, or it did not record what a rerun needs."""


def file_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def uncommitted_changes_sha256(root: Path = PROJECT_ROOT) -> str:
    """sha256 of `git diff HEAD` over the code: equal hashes mean the same uncommitted code."""
    try:
        diff = subprocess.run(
            ["git", "-C", str(root), "diff", "HEAD", "--binary", "--", *CODE_PATHS],
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return hashlib.sha256(diff).hexdigest()


def code_snapshot(spec: RunSpec) -> dict[str, str]:
    """What a rerun compares beyond the environment fingerprint; recorded as tags of every run."""
    return {
        "workload_sha256": file_sha256(Path(spec.workload.entrypoint)),
        "git_diff_sha256": uncommitted_changes_sha256(),
        "lock_sha256": file_sha256(lock_path()),
        "platform": f"{platform.system()}-{platform.machine()}",
    }


@dataclass(frozen=True)
class RecordedRun:
    """An earlier run as MLflow recorded it."""

    mlflow_run_id: str
    tracking_uri: str
    spec: RunSpec
    tags: dict[str, str]
    packages: dict[str, str]
    params_sha256: str | None

    @property
    def run_name(self) -> str:
        return self.tags.get("trainflow.run_id", self.mlflow_run_id)


def recorded_spec_sha256(raw: object) -> str:
    """sha256 of a recorded spec document as the run computed its spec_hash (RunSpec.spec_hash): over the
    document itself, so a spec recorded by an older trainflow (fewer fields) keeps its hash."""
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def spec_disagreements(raw: object, spec: RunSpec, tags: dict[str, str], params: dict[str, str]) -> list[str]:
    """How a recorded spec differs from what its run recorded when it started: the spec_hash tag and the
    params (MLflow never changes a param once logged); empty when they agree."""
    from trainflow.reporting.tracking import spec_params

    found = []
    recorded_hash = tags.get("spec_hash")
    if recorded_hash is None:
        found.append("the run recorded no spec_hash to check it against")
    elif recorded_spec_sha256(raw) != recorded_hash:
        found.append(
            f"its sha256 {_short(recorded_spec_sha256(raw))} is not the run's spec_hash {_short(recorded_hash)}"
        )
    for name, value in spec_params(spec).items():
        ran, now = params.get(name), str(value)
        if ran is not None and ran != now and not (len(now) > MLFLOW_PARAM_LENGTH and now.startswith(ran)):
            found.append(f"{name}: {value} in the spec, {ran} in the run's params")
    return found


def load_recorded_run(mlflow_run_id: str, tracking_uri: str) -> RecordedRun:
    """Read the spec, code identity and environment a run recorded; RerunError says what is missing."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        run = client.get_run(mlflow_run_id)
    except MlflowException:
        raise RerunError(f"no MLflow run {mlflow_run_id!r} in {tracking_uri} (pass --tracking-uri?)") from None
    tags = dict(run.data.tags)
    if "env_fingerprint" not in tags or "git_commit" not in tags:
        raise RerunError(
            f"run {mlflow_run_id} recorded no environment fingerprint or code commit "
            "(it stopped before preparing its environment); it cannot be rerun reproducibly"
        )
    with tempfile.TemporaryDirectory(prefix="trainflow-rerun-") as folder:
        try:
            spec_file = Path(client.download_artifacts(mlflow_run_id, SPEC_ARTIFACT, folder))
            packages_file = Path(client.download_artifacts(mlflow_run_id, PACKAGES_ARTIFACT, folder))
        except (MlflowException, OSError) as exc:
            raise RerunError(f"run {mlflow_run_id}: a recorded artifact is missing: {exc}") from None
        try:
            raw = yaml.safe_load(spec_file.read_text())
            spec = parse_spec(raw, source=f"run {mlflow_run_id}: {SPEC_ARTIFACT}")
        except (SpecError, yaml.YAMLError) as exc:
            raise RerunError(f"{exc} (the spec format changed since; rerun with the recorded code)") from None
        packages = json.loads(packages_file.read_text())
    disagreements = spec_disagreements(raw, spec, tags, dict(run.data.params))
    if disagreements:
        raise RerunError(
            f"refusing to rerun {mlflow_run_id}: its recorded {SPEC_ARTIFACT} is not the spec it ran "
            f"({'; '.join(disagreements)}); the artifact was changed after the run"
        )
    return RecordedRun(
        mlflow_run_id=mlflow_run_id,
        tracking_uri=tracking_uri,
        spec=spec,
        tags=tags,
        packages=packages,
        params_sha256=tags.get("params_sha256"),
    )


def _short(digest: str) -> str:
    return digest[:12]


def package_drift(recorded: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per package that was added, removed or changed (trainflow itself is the code, not the environment)."""
    names = sorted((set(recorded) | set(installed)) - {"trainflow"})
    lines = []
    for name in names:
        was, now = recorded.get(name), installed.get(name)
        if was == now:
            continue
        if was is None:
            lines.append(f"environment: package {name} {now} is installed here but was not in the recorded run")
        elif now is None:
            lines.append(f"environment: package {name} {was} was recorded but is not installed here")
        else:
            lines.append(f"environment: package {name} {was} was recorded, {now} is installed here")
    if len(lines) > SHOWN_PACKAGES:
        lines = lines[:SHOWN_PACKAGES] + [f"environment: and {len(lines) - SHOWN_PACKAGES} more package differences"]
    return lines


def detect_drift(recorded: RecordedRun, environment: Environment, code: dict[str, str]) -> list[str]:
    """Every way the code and environment here differ from what the run recorded; empty when none."""
    tags = recorded.tags
    drift = []
    if tags["git_commit"] != environment.git_commit:
        drift.append(
            f"code: commit {_short(tags['git_commit'])} was recorded, {_short(environment.git_commit)} is checked out"
        )
    was_dirty = tags.get("git_dirty") == "true"
    if was_dirty != environment.git_dirty:
        state = lambda dirty: "uncommitted changes" if dirty else "a clean tree"  # noqa: E731
        drift.append(f"code: the run had {state(was_dirty)}, this checkout has {state(environment.git_dirty)}")
    elif was_dirty and tags.get("git_diff_sha256") not in (None, code["git_diff_sha256"]):
        drift.append("code: the uncommitted changes to the code differ from the recorded run's (git diff HEAD)")
    if tags.get("workload_sha256") not in (None, code["workload_sha256"]):
        drift.append(
            f"code: the training script {recorded.spec.workload.entrypoint} changed "
            f"(sha256 {_short(tags['workload_sha256'])} recorded, {_short(code['workload_sha256'])} here)"
        )
    for tag, label, now in [
        ("python_version", "Python", environment.python),
        ("torch_version", "torch", environment.torch),
        ("platform", "platform", environment.platform),
    ]:
        if tags.get(tag) not in (None, now):
            drift.append(f"environment: {label} {tags[tag]} was recorded, {now} is here")
    if tags.get("lock_sha256") not in (None, environment.lock_sha256):
        drift.append(f"environment: {lock_path().name} differs from the recorded run's")
    drift += package_drift(recorded.packages, environment.packages)
    if not drift and tags["env_fingerprint"] != environment.fingerprint:
        drift.append(
            f"environment: fingerprint {_short(tags['env_fingerprint'])} was recorded, "
            f"{_short(environment.fingerprint)} is here"
        )
    return drift


def check_rerun(recorded: RecordedRun) -> list[str]:
    """The drift between the recorded run and this checkout and environment."""
    return detect_drift(recorded, fingerprint_environment(), code_snapshot(recorded.spec))


def refusal(recorded: RecordedRun, drift: list[str]) -> str:
    lines = "\n".join(f"  - {line}" for line in drift)
    return (
        f"refusing to rerun {recorded.mlflow_run_id} ({recorded.run_name}): the code or environment here "
        f"differ from what it recorded:\n{lines}\n"
        "Check out the recorded commit and run `make venv`, or pass --allow-drift (allow_drift=true) "
        "to run anyway and record the drift on the new run."
    )


@dataclass(frozen=True)
class Lineage:
    """What a run reruns, and the drift it accepted."""

    rerun_of: str
    drift: tuple[str, ...] = ()
    allow_drift: bool = False  # started with --allow-drift (allow_drift=true), whether or not it drifted

    def tags(self) -> dict[str, str]:
        return {
            "rerun_of": self.rerun_of,
            "rerun_drift": "true" if self.drift else "false",
            "rerun_allow_drift": str(self.allow_drift).lower(),
        }


_LINEAGE: contextvars.ContextVar[Lineage | None] = contextvars.ContextVar("trainflow_lineage", default=None)


@contextmanager
def rerunning(lineage: Lineage) -> Iterator[None]:
    """Runs started inside are reruns: their tracking records `lineage`."""
    token = _LINEAGE.set(lineage)
    try:
        yield
    finally:
        _LINEAGE.reset(token)


def current_lineage() -> Lineage | None:
    return _LINEAGE.get()
