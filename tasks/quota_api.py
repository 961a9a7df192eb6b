"""The Prefect server's global concurrency limits (`/v2/concurrency_limits/`), as team quotas need them."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from httpx import HTTPStatusError
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
from prefect.exceptions import ObjectNotFound

from trainflow.quota import LIMIT_PREFIX, QuotaError

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
    return TeamLimit(team=name.removeprefix(LIMIT_PREFIX), name=found.name, devices=found.limit,
                     held=found.active_slots, active=found.active)


def list_limits() -> list[TeamLimit]:
    """Every team quota on the server (limits named trainflow-team-*)."""
    found, offset, page = [], 0, 200
    with get_client(sync_client=True) as client:
        while True:
            batch = client.read_global_concurrency_limits(limit=page, offset=offset)
            found += [TeamLimit(team=limit.name.removeprefix(LIMIT_PREFIX), name=limit.name, devices=limit.limit,
                                held=limit.active_slots, active=limit.active)
                      for limit in batch if limit.name.startswith(LIMIT_PREFIX)]
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
                names=[name], slots=devices, mode="concurrency", lease_duration=LEASE_S, holder=holder)
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
