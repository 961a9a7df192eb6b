"""Team quotas: how many devices a team's runs may hold at once, as a Prefect global concurrency limit.

A run's team is its `tracking.tags.team` (the tag that already attributes its device-hours); a run
without one belongs to the `default` team. Team `vision` is limited by the global concurrency limit
`trainflow-team-vision`, counted in devices (world size = nodes x procs_per_node: GPUs, or CPU
processes on the local backend). A team without a limit is not limited.

While a run holds its devices, `<TRAINFLOW_HOME>/quota/<run id>.json` names its lease and its
orchestrator, so a later run can give back the slots of an orchestrator that died (the server
also revokes a lease nobody renews once it expires).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from trainflow.home import trainflow_home
from trainflow.runspec import RunSpec

LIMIT_PREFIX = "trainflow-team-"
DEFAULT_TEAM = "default"
TEAM_TAG = "team"
TEMPORARY_SERVER_ENV = "TRAINFLOW_PREFECT_TEMPORARY"  # set while a command runs on its own temporary server
_TEAM_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")


class QuotaError(ValueError):
    """A quota asked of, or set on, the Prefect server is not possible (bad input)."""


def limit_name(team: str) -> str:
    """The global concurrency limit of `team`; raises QuotaError for a name Prefect or Kueue would refuse."""
    if not _TEAM_NAME.match(team):
        raise QuotaError(f"team {team!r}: use lower-case letters, digits, '.', '_' or '-' (at most 63)")
    return LIMIT_PREFIX + team


def team_of(spec: RunSpec) -> str:
    return spec.tracking.tags.get(TEAM_TAG) or DEFAULT_TEAM


@dataclass(frozen=True)
class QuotaNeed:
    """What one run asks of its team's quota."""

    team: str
    limit: str
    devices: int

    @classmethod
    def of(cls, spec: RunSpec) -> QuotaNeed:
        team = team_of(spec)
        try:
            name = limit_name(team)
        except QuotaError as exc:
            raise QuotaError(f"tracking.tags.team: {exc}") from None
        return cls(team=team, limit=name, devices=spec.resources.world_size)

    def too_large(self, limit: int) -> str | None:
        """The bad-input message when this run alone needs more than the whole limit, else None."""
        if self.devices <= limit:
            return None
        return (
            f"resources: the run needs {self.devices} devices (nodes x procs_per_node), more than quota "
            f"{self.limit} allows at once ({limit}); use fewer or raise it with "
            f"`trainflow quota set {self.team} --devices {self.devices}`"
        )


@dataclass(frozen=True)
class QuotaNeedOfRun:
    """What a flow run holds of a limit; `limit` None when its parameters do not say."""

    flow_run_id: str
    limit: str | None
    devices: int


def need_of_parameters(flow_run_id: str, parameters: dict) -> QuotaNeedOfRun:
    """A lifecycle flow run's need, from the spec it was started with (as the server stores it)."""
    try:
        spec = parameters["spec"]
        resources = spec.get("resources") or {}
        team = ((spec.get("tracking") or {}).get("tags") or {}).get(TEAM_TAG) or DEFAULT_TEAM
        devices = int(resources.get("nodes", 1)) * int(resources.get("procs_per_node", 1))
        return QuotaNeedOfRun(flow_run_id, limit_name(team), devices)
    except (KeyError, TypeError, ValueError, AttributeError, QuotaError):
        return QuotaNeedOfRun(flow_run_id, None, 0)


@dataclass(frozen=True)
class StaleSlots:
    """Devices a limit counts as held beyond what its holding runs hold: held by runs that no
    longer exist (a lease the server lost in a restart, a release that never reached it)."""

    limit: str
    held: int
    held_by_runs: int

    @property
    def stale(self) -> int:
        return max(0, self.held - self.held_by_runs)


def stale_slots(held: dict[str, int], holders: list[QuotaNeedOfRun]) -> dict[str, StaleSlots] | None:
    """Per limit, what it counts against what its holding runs hold; None when a holder's devices are
    unknown (its spec unreadable), since then nothing can be called stale safely."""
    if any(holder.limit is None for holder in holders):
        return None
    return {
        name: StaleSlots(name, count, sum(h.devices for h in holders if h.limit == name))
        for name, count in held.items()
    }


@dataclass(frozen=True)
class QuotaLease:
    """Devices a run holds under its team's limit, from before provision until after teardown."""

    limit: str
    devices: int
    lease_id: str
    waited_s: float


def queued_line(need: QuotaNeed, held: int, limit: int) -> str:
    return f"queued for quota {need.limit}: needs {need.devices} devices, {held}/{limit} held"


def acquired_line(need: QuotaNeed, limit: int, held_when_queued: int | None, waited_s: float) -> str:
    """What a run says once it holds its devices: how long it was queued, if it was."""
    if held_when_queued is None:
        return f"quota {need.limit}: holds {need.devices} of {limit} devices"
    return f"{queued_line(need, held_when_queued, limit)}, waited {waited_s:.0f} s"


# --- lease files: which orchestrator holds which lease ---------------------------------------------


def lease_folder() -> Path:
    return trainflow_home() / "quota"


def write_lease_file(run_id: str, lease: QuotaLease) -> Path:
    proc = psutil.Process()
    folder = lease_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{run_id}.json"
    path.write_text(json.dumps({**asdict(lease), "run_id": run_id, "pid": proc.pid, "pid_started": proc.create_time()}))
    return path


def remove_lease_file(run_id: str) -> None:
    (lease_folder() / f"{run_id}.json").unlink(missing_ok=True)


@dataclass(frozen=True)
class DeadHolder:
    """A lease whose orchestrator is gone without giving it back."""

    run_id: str
    lease_id: str
    limit: str
    devices: int


def dead_holders() -> list[DeadHolder]:
    found = []
    for path in sorted(lease_folder().glob("*.json")):
        try:
            record = json.loads(path.read_text())
            alive = _alive(record["pid"], record["pid_started"])
            holder = DeadHolder(record["run_id"], record["lease_id"], record["limit"], record["devices"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not alive:
            found.append(holder)
    return found


def _alive(pid: int, started: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except psutil.Error:
        return False
