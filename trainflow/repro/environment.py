"""The environment the workers run in: what is installed, which code, and whether it fits the lock.

The fingerprint names an environment exactly (Python, every installed distribution, the code's
commit and whether the tree was dirty), so a rerun can prove it runs where the original ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LOCK_ENV = "TRAINFLOW_LOCK"
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;#]+)")


class EnvironmentMismatch(RuntimeError):
    """The installed environment does not satisfy the lock file."""


@dataclass(frozen=True)
class Environment:
    python: str
    torch: str
    platform: str
    packages: dict[str, str]
    git_commit: str
    git_dirty: bool
    lock_sha256: str
    fingerprint: str = field(default="")

    def summary(self) -> dict:
        data = asdict(self)
        data.pop("packages")
        data["package_count"] = len(self.packages)
        return data


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or PROJECT_ROOT / "requirements.lock")


def read_lock(path: Path) -> dict[str, str]:
    """name -> pinned version for every `name==version` line of a lock file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise EnvironmentMismatch(f"{path}: lock file not found (set {LOCK_ENV} to its path)") from None
    pins = {}
    for line in text.splitlines():
        match = _PIN.match(line)
        if match:
            pins[normalize(match.group(1))] = match.group(3)
    return pins


def installed_packages() -> dict[str, str]:
    return {normalize(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def base_version(version: str) -> str:
    return version.split("+", 1)[0]  # torch 2.13.0+cpu satisfies a pin of 2.13.0


def lock_problems(pins: dict[str, str], installed: dict[str, str]) -> list[str]:
    problems = []
    for name, wanted in sorted(pins.items()):
        have = installed.get(name)
        if have is None:
            problems.append(f"{name}=={wanted} is not installed")
        elif base_version(have) != base_version(wanted):
            problems.append(f"{name} {have} is installed, the lock pins {wanted}")
    return problems


def git_state(root: Path = PROJECT_ROOT) -> tuple[str, bool]:
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout.strip()
        )
        return commit, dirty
    except (OSError, subprocess.SubprocessError):
        # inside a built image there is no .git: the build records the commit instead
        commit = os.environ.get("TRAINFLOW_GIT_COMMIT")
        return (commit, False) if commit else ("unknown", True)


@dataclass(frozen=True)
class WorkloadRepo:
    """The repository the training script lives in, apart from trainflow's own: "none" outside any."""

    root: str
    git_commit: str
    git_dirty: str  # "true", "false", or "none"

    def tags(self) -> dict[str, str]:
        return {
            "workload_git_repo": self.root,
            "workload_git_commit": self.git_commit,
            "workload_git_dirty": self.git_dirty,
        }


NO_REPO = WorkloadRepo(root="none", git_commit="none", git_dirty="none")


def workload_repo(entrypoint: Path) -> WorkloadRepo:
    """The git state of the repository holding `entrypoint` (its own, not trainflow's)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(entrypoint.resolve().parent), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    root = git("rev-parse", "--show-toplevel")
    if not root:
        return NO_REPO
    commit = git("rev-parse", "HEAD") or "none"  # "none": a repository without a commit yet
    changes = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    dirty = "none" if changes is None else str(bool(changes) or commit == "none").lower()
    return WorkloadRepo(root=root, git_commit=commit, git_dirty=dirty)


def fingerprint_environment(lock: Path | None = None) -> Environment:
    """Describe this environment and check it against the lock; EnvironmentMismatch lists the gaps."""
    lock = lock or lock_path()
    pins = read_lock(lock)
    packages = installed_packages()
    problems = lock_problems(pins, packages)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise EnvironmentMismatch(f"environment does not satisfy {lock.name}: {shown} (run `make venv`)")
    commit, dirty = git_state()
    env = Environment(
        python=platform.python_version(),
        torch=packages.get("torch", "missing"),
        platform=f"{platform.system()}-{platform.machine()}",
        packages=packages,
        git_commit=commit,
        git_dirty=dirty,
        lock_sha256=hashlib.sha256(lock.read_bytes()).hexdigest(),
    )
    identity = {k: v for k, v in asdict(env).items() if k != "fingerprint"}
    identity["packages"] = {k: v for k, v in packages.items() if k != "trainflow"}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return Environment(**{**asdict(env), "fingerprint": digest})
