"""Usage and cost per team, owner or experiment, added up from the MLflow runs trainflow recorded.

Every figure is one a run recorded about itself, summed per group; nothing is recomputed here:
- device-hours, wasted device-hours, lost work and recovery: finalize's cost metrics of the run
  (`device_hours`, `wasted_device_hours`, `lost_work_s`, `recovery_s_total`, × `world_size`);
- detection: each failed attempt's `detection_latency_s` × its world size (nested attempt runs);
- failures by kind: the `outcome` tag of every attempt that did not succeed;
- time queued for quota: the metric `quota_wait_s`, 0 where a run has none;
- checkpoint bytes stored: the run's checkpoint index (artifact checkpoints/index.json).
A run that never reached finalize (killed, crashed orchestrator) has no cost metrics: it counts as
a run with 0 device-hours and is listed in `unmeasured_runs`.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from mlflow.tracking import MlflowClient

from trainflow.reporting.figures import summary_figures
from trainflow.reporting.tracking import PARENT_TAG

NO_GROUP = "(none)"
CHECKPOINT_INDEX = "checkpoints/index.json"
SINCE_UNITS_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
PAGE = 1000


class GroupBy(str, Enum):
    team = "team"
    owner = "owner"
    experiment = "experiment"


class UsageError(ValueError):
    """Bad input to a usage report (the message names the option)."""


def parse_since(text: str) -> float:
    """'30d', '12h', '2w', '90m' as seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mhdw])\s*", text or "")
    if not found or float(found.group(1)) <= 0:
        raise UsageError(f"--since {text!r}: give a positive number with a unit m, h, d or w (e.g. 30d)")
    return float(found.group(1)) * SINCE_UNITS_S[found.group(2)]


@dataclass(frozen=True)
class RunUsage:
    """What one lifecycle run used and lost, as MLflow recorded it."""

    mlflow_run_id: str
    run_id: str
    experiment: str
    team: str
    owner: str
    succeeded: bool
    measured: bool  # the run recorded its cost figures (it reached finalize)
    started_at: float
    ended_at: float | None
    world_size: int
    device_hours: float
    wasted_device_hours: float
    lost_work_device_hours: float
    detection_device_hours: float
    recovery_device_hours: float
    quota_wait_s: float
    checkpoint_bytes: int
    failures: dict[str, int]

    def group(self, by: GroupBy) -> str:
        return getattr(self, by.value) or NO_GROUP


@dataclass
class GroupUsage:
    """The sums over one group's runs."""

    group: str
    runs: int = 0
    succeeded: int = 0
    unmeasured_runs: int = 0
    device_hours: float = 0.0
    wasted_device_hours: float = 0.0
    lost_work_device_hours: float = 0.0
    detection_device_hours: float = 0.0
    recovery_device_hours: float = 0.0
    quota_wait_s: float = 0.0
    checkpoint_bytes: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    peak_devices: int = 0  # devices held at once, at the busiest moment
    device_limit: int | None = None  # the team's quota, when one is set on a reachable Prefect server

    @property
    def success_rate(self) -> float:
        return self.succeeded / self.runs if self.runs else 0.0

    @property
    def wasted_share(self) -> float:
        return self.wasted_device_hours / self.device_hours if self.device_hours else 0.0

    def add(self, run: RunUsage) -> None:
        self.runs += 1
        self.succeeded += run.succeeded
        self.unmeasured_runs += not run.measured
        for name in (
            "device_hours",
            "wasted_device_hours",
            "lost_work_device_hours",
            "detection_device_hours",
            "recovery_device_hours",
            "quota_wait_s",
            "checkpoint_bytes",
        ):
            setattr(self, name, getattr(self, name) + getattr(run, name))
        failures = Counter(self.failures)
        failures.update(run.failures)
        self.failures = dict(sorted(failures.items()))

    def as_row(self) -> dict:
        """The group as JSON values, the rates included."""
        return {
            "group": self.group,
            "runs": self.runs,
            "succeeded": self.succeeded,
            "success_rate": round(self.success_rate, 4),
            "device_hours": round(self.device_hours, 6),
            "wasted_device_hours": round(self.wasted_device_hours, 6),
            "wasted_share": round(self.wasted_share, 4),
            "lost_work_device_hours": round(self.lost_work_device_hours, 6),
            "detection_device_hours": round(self.detection_device_hours, 6),
            "recovery_device_hours": round(self.recovery_device_hours, 6),
            "failures": self.failures,
            "quota_wait_s": round(self.quota_wait_s, 3),
            "checkpoint_bytes": self.checkpoint_bytes,
            "peak_devices": self.peak_devices,
            "device_limit": self.device_limit,
            "unmeasured_runs": self.unmeasured_runs,
        }


@dataclass
class UsageReport:
    by: GroupBy
    since_s: float
    tracking_uri: str
    generated_at: float
    groups: list[GroupUsage]
    total: GroupUsage
    limits_checked: bool  # whether a Prefect server answered for the teams' limits

    def as_dict(self) -> dict:
        return {
            "by": self.by.value,
            "since_s": self.since_s,
            "tracking_uri": self.tracking_uri,
            "generated_at": self.generated_at,
            "limits_checked": self.limits_checked,
            "groups": [group.as_row() for group in self.groups],
            "total": self.total.as_row(),
        }


def peak_devices(runs: list[RunUsage], now: float) -> int:
    """The most devices held at once: each run holds its world size from its start to its end."""
    changes = [(run.started_at, run.world_size) for run in runs]
    changes += [(run.ended_at if run.ended_at is not None else now, -run.world_size) for run in runs]
    held = peak = 0
    for _, change in sorted(changes, key=lambda item: (item[0], item[1])):  # ends before starts at a tie
        held += change
        peak = max(peak, held)
    return peak


def summarize(runs: list[RunUsage], by: GroupBy, now: float) -> tuple[list[GroupUsage], GroupUsage]:
    """Per group and in total, largest device-hours first."""
    groups: dict[str, GroupUsage] = {}
    members: dict[str, list[RunUsage]] = {}
    total = GroupUsage("total")
    for run in runs:
        name = run.group(by)
        groups.setdefault(name, GroupUsage(name)).add(run)
        members.setdefault(name, []).append(run)
        total.add(run)
    for name, group in groups.items():
        group.peak_devices = peak_devices(members[name], now)
    total.peak_devices = peak_devices(runs, now)
    return sorted(groups.values(), key=lambda g: (-g.device_hours, g.group)), total


def _search(client: MlflowClient, experiment_ids: list[str], filter_string: str) -> list:
    found, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=PAGE, page_token=token)
        found += list(page)
        token = page.token
        if not token:
            return found


def _checkpoint_bytes(client: MlflowClient, run_id: str) -> int:
    with tempfile.TemporaryDirectory(prefix="trainflow-usage-") as folder:
        try:
            index = json.loads(Path(client.download_artifacts(run_id, CHECKPOINT_INDEX, folder)).read_text())
        except Exception:  # noqa: BLE001 - a run without an index (stopped early) stored nothing we know of
            return 0
    return sum(int(entry.get("bytes") or 0) for entry in index)


def _usage_of(client: MlflowClient, run, experiment: str, attempts: list) -> RunUsage:
    tags, metrics, params = run.data.tags, summary_figures(run.data.metrics), run.data.params
    world_size = int(params.get("world_size") or 0)
    failures = Counter(
        a.data.tags["outcome"]
        for a in attempts
        if a.data.tags.get("outcome", "SUCCEEDED") not in ("SUCCEEDED", "RESIZED")  # a resize is no failure
    )
    detection_s = sum(
        a.data.metrics.get("detection_latency_s", 0.0) * int(a.data.params.get("world_size") or world_size)
        for a in attempts
        if a.data.tags.get("outcome", "SUCCEEDED") != "SUCCEEDED"
    )
    return RunUsage(
        mlflow_run_id=run.info.run_id,
        run_id=tags["trainflow.run_id"],
        experiment=experiment,
        team=tags.get("team", ""),
        owner=tags.get("owner", ""),
        succeeded=tags.get("status") == "succeeded",
        measured="device_hours" in metrics,
        started_at=run.info.start_time / 1000,
        ended_at=run.info.end_time / 1000 if run.info.end_time else None,
        world_size=world_size,
        device_hours=metrics.get("device_hours", 0.0),
        wasted_device_hours=metrics.get("wasted_device_hours", 0.0),
        lost_work_device_hours=world_size * metrics.get("lost_work_s", 0.0) / 3600,
        detection_device_hours=detection_s / 3600,
        recovery_device_hours=world_size * metrics.get("recovery_s_total", 0.0) / 3600,
        quota_wait_s=metrics.get("quota_wait_s", 0.0),
        checkpoint_bytes=_checkpoint_bytes(client, run.info.run_id),
        failures=dict(failures),
    )


def read_runs(tracking_uri: str, since_s: float, now: float) -> list[RunUsage]:
    """Every lifecycle run started in the last `since_s` seconds, in every experiment of the store."""
    client = MlflowClient(tracking_uri=tracking_uri)
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    if not experiments:
        return []
    since_ms = int((now - since_s) * 1000)
    found = _search(client, list(experiments), f"attributes.start_time >= {since_ms}")
    attempts: dict[str, list] = {}
    lifecycles = []
    for run in found:
        parent = run.data.tags.get(PARENT_TAG)
        if parent:
            attempts.setdefault(parent, []).append(run)
        elif "trainflow.run_id" in run.data.tags:
            lifecycles.append(run)
    return [
        _usage_of(client, run, experiments[run.info.experiment_id], attempts.get(run.info.run_id, []))
        for run in lifecycles
    ]


def build_report(tracking_uri: str, by: GroupBy, since_s: float, now: float | None = None) -> UsageReport:
    """The usage report, its team limits not yet compared (see `compare_limits`)."""
    now = time.time() if now is None else now
    groups, total = summarize(read_runs(tracking_uri, since_s, now), by, now)
    return UsageReport(by, since_s, tracking_uri, now, groups, total, limits_checked=False)


def compare_limits(report: UsageReport, limits: dict[str, int]) -> None:
    """Put each team's device limit beside its peak demand (`limits` from a Prefect server that answered)."""
    report.limits_checked = True
    if report.by == GroupBy.team:
        for group in report.groups:
            group.device_limit = limits.get(group.group)
