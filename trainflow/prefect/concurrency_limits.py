"""The Prefect server's global concurrency limits (`/v2/concurrency_limits/`), as team quotas need them."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from httpx import HTTPStatusError
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    TaskRunFilter,
    TaskRunFilterFlowRunId,
    TaskRunFilterName,
)
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound

from trainflow.quota import LIMIT_PREFIX, QuotaError, QuotaNeedOfRun, need_of_parameters

HTTP_GONE = 410
HTTP_LOCKED = 423
HTTP_UNPROCESSABLE = 422
LEASE_S = 60.0  # an orchestrator that stops renewing (it died) frees its slots this long after


@dataclass(frozen=True)
class TeamLimit:
    """One team's quota as the server holds it."""

    team: str
    name: str
    devices: int
    held: int
    active: bool


def read_limit(name: str) -> TeamLimit | None:
    """The limit called `name`, or None when there is none (the team is not limited)."""
    with get_client(sync_client=True) as client:
        try:
            found = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None
    return TeamLimit(
        team=name.removeprefix(LIMIT_PREFIX),
        name=found.name,
        devices=found.limit,
        held=found.active_slots,
        active=found.active,
    )


def list_limits() -> list[TeamLimit]:
    """Every team quota on the server (limits named trainflow-team-*)."""
    found, offset, page = [], 0, 200
    with get_client(sync_client=True) as client:
        while True:
            batch = client.read_global_concurrency_limits(limit=page, offset=offset)
            found += [
                TeamLimit(
                    team=limit.name.removeprefix(LIMIT_PREFIX),
                    name=limit.name,
                    devices=limit.limit,
                    held=limit.active_slots,
                    active=limit.active,
                )
                for limit in batch
                if limit.name.startswith(LIMIT_PREFIX)
            ]
            if len(batch) < page:
                return sorted(found, key=lambda limit: limit.name)
            offset += page


def set_limit(name: str, devices: int) -> None:
    """Create the limit or change its size; active either way, with no slot decay (slots are held, not rated)."""
    if devices < 1:
        raise QuotaError(f"--devices: {devices} is not a positive number of devices")
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, devices)
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active=True))


def delete_limit(name: str) -> bool:
    """Remove the limit; False when there was none."""
    with get_client(sync_client=True) as client:
        try:
            client.delete_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return False
    return True


def try_acquire(name: str, devices: int, holder_id: UUID | None) -> str | None:
    """Take `devices` slots of limit `name` under a new lease, now or not at all: the lease id, or
    None while the limit has no room."""
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder

    holder = ConcurrencyLeaseHolder(type="flow_run", id=holder_id) if holder_id else None
    with get_client(sync_client=True) as client:
        try:
            response = client.increment_concurrency_slots_with_lease(
                names=[name], slots=devices, mode="concurrency", lease_duration=LEASE_S, holder=holder
            )
        except HTTPStatusError as exc:
            if exc.response.status_code == HTTP_LOCKED:
                return None
            if exc.response.status_code == HTTP_UNPROCESSABLE:  # the limit was made smaller meanwhile
                raise QuotaError(f"quota {name} is now smaller than the {devices} devices the run needs") from None
            raise
    return response.json()["lease_id"]


def renew(lease_id: str) -> None:
    with get_client(sync_client=True) as client:
        client.renew_concurrency_lease(UUID(lease_id), LEASE_S)


def release(lease_id: str) -> None:
    """Give a lease's slots back (a lease the server already revoked is a no-op)."""
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots_with_lease(UUID(lease_id))


def lease_exists(lease_id: str) -> bool:
    """Whether the server still knows the lease: renewing it is the one way to ask. A server keeps its
    leases in memory by default, so after a restart it knows none, while their slots still count."""
    with get_client(sync_client=True) as client:
        try:
            client.renew_concurrency_lease(UUID(lease_id), LEASE_S)
        except HTTPStatusError as exc:
            if exc.response.status_code == HTTP_GONE:
                return False
            raise
    return True


def give_back_slots(name: str, devices: int) -> None:
    """Take `devices` off the limit's held count directly: slots no lease of the server backs any more."""
    with get_client(sync_client=True) as client:
        client.release_concurrency_slots(names=[name], slots=devices, occupancy_seconds=1.0)


LIFECYCLE_FLOWS = ["training-lifecycle", "faulted-lifecycle"]  # the flows whose runs take a team's quota
UNFINISHED = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED, StateType.CANCELLING]
TAKE_TASK, GIVE_BACK_TASK = "wait-for-quota", "release-quota"  # tasks/quota.py's task names


def holding_runs() -> list[QuotaNeedOfRun]:
    """The lifecycle flow runs that hold their team's devices now: unfinished, their wait-for-quota
    task completed (a run still queued holds nothing) and their release-quota task not. The slots a
    limit counts beyond what these hold belong to runs that no longer exist."""
    found, offset, page = [], 0, 200
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=LIFECYCLE_FLOWS)),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=UNFINISHED))),
                limit=page,
                offset=offset,
            )
            done = _quota_tasks_completed(client, [run.id for run in runs])
            found += [
                need_of_parameters(str(run.id), run.parameters)
                for run in runs
                if done.get((run.id, TAKE_TASK)) and not done.get((run.id, GIVE_BACK_TASK))
            ]
            if len(runs) < page:
                return found
            offset += page


def _quota_tasks_completed(client, flow_run_ids: list) -> dict[tuple, bool]:
    """(flow run id, task name) -> whether that quota task of the flow run has completed."""
    if not flow_run_ids:
        return {}
    done: dict[tuple, bool] = {}
    for task in client.read_task_runs(
        task_run_filter=TaskRunFilter(
            flow_run_id=TaskRunFilterFlowRunId(any_=flow_run_ids), name=TaskRunFilterName(like_="quota")
        )
    ):
        for name in (TAKE_TASK, GIVE_BACK_TASK):
            if task.name.startswith(name):
                key = (task.flow_run_id, name)
                done[key] = done.get(key, False) or (task.state is not None and task.state.is_completed())
    return done


def counted_without_lease(limit: str, devices: int, own_flow_run: str | None) -> int:
    """How many of a run's `devices` the limit still counts although the server lost the run's lease:
    what it holds beyond the other holding runs' devices, at most `devices` (0: the server gave them
    back itself when the lease expired)."""
    others = [run for run in holding_runs() if run.flow_run_id != own_flow_run]
    current = read_limit(limit)
    if current is None:
        return 0
    held_by_others = sum(run.devices for run in others if run.limit == limit)
    return max(0, min(devices, current.held - held_by_others))
