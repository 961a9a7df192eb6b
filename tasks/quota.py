"""wait-for-quota / release-quota: a run holds its team's devices from before provision until after teardown.

A run that would take its team past its limit waits here, saying so in its log (the Prefect UI and
`trainflow run`'s output) and recording how long in MLflow (`quota_wait_s`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from uuid import UUID

from prefect import get_run_logger
from prefect.settings import PREFECT_API_URL

from tasks import lifecycle_task
from trainflow.orchestrator.interrupts import signals_deferred
from trainflow.prefect import concurrency_limits
from trainflow.prefect.records import RunRecord
from trainflow.quota import (
    LIMIT_PREFIX,
    TEMPORARY_SERVER_ENV,
    QuotaError,
    QuotaLease,
    QuotaNeed,
    acquired_line,
    dead_holders,
    queued_line,
    remove_lease_file,
    write_lease_file,
)
from trainflow.reporting.tracking import Tracker

POLL_S = 2.0  # how often a queued run asks again; the server's Retry-After can be far longer
RENEW_EVERY_S = concurrency_limits.LEASE_S / 4
RELEASE_RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0)  # a server restarting answers again within these


@dataclass
class HeldQuota:
    """A lease and the thread that keeps renewing it while the run lives."""

    run_id: str
    lease: QuotaLease
    holder: UUID | None = None  # the flow run the server records as the lease's holder
    stop: threading.Event = field(default_factory=threading.Event)
    renewer: threading.Thread | None = None

    def as_dict(self) -> dict:
        return {"limit": self.lease.limit, "devices": self.lease.devices, "waited_s": round(self.lease.waited_s, 1)}


@lifecycle_task(name="wait-for-quota")
def wait_for_quota(record: RunRecord) -> HeldQuota | None:
    """Take the run's devices from its team's quota, waiting while the team's other runs hold it;
    None when the team is not limited."""
    logger = get_run_logger()
    spec = record.spec
    if os.environ.get(TEMPORARY_SERVER_ENV) or not PREFECT_API_URL.value():
        logger.info("team quotas are not enforced on a temporary Prefect server (set PREFECT_API_URL)")
        return None
    give_back_dead_holders(logger)
    need = QuotaNeed.of(spec)
    limit = concurrency_limits.read_limit(need.limit)
    if limit is None or not limit.active:
        logger.info("team %s has no quota (%s): not limited", need.team, need.limit)
        return None
    problem = need.too_large(limit.devices)
    if problem:
        raise QuotaError(problem)
    lease = None
    try:
        lease, held_when_queued = _take_when_free(need, record, logger)
        logger.info(acquired_line(need, limit.devices, held_when_queued, lease.waited_s))
        Tracker(record.tracking_uri).log_metrics(
            record.mlflow_run_id, [("quota_wait_s", round(lease.waited_s, 3), 0, time.time())]
        )
        held = HeldQuota(
            run_id=record.run_id,
            lease=lease,
            holder=UUID(record.prefect_flow_run_id) if record.prefect_flow_run_id else None,
        )
        held.renewer = threading.Thread(
            target=_renew_until_stopped, args=(held, logger), daemon=True, name=f"quota-lease-{lease.lease_id[:8]}"
        )
        held.renewer.start()
        return held
    except BaseException:  # a failed MLflow write, Ctrl-C: the run stops before it holds anything
        if lease is not None:
            _give_back(lease, record.run_id)
        raise


def _take_when_free(need: QuotaNeed, record: RunRecord, logger) -> tuple[QuotaLease, int | None]:
    """The lease once the limit has room, and how many devices were held when the run first had
    to queue (None: it did not)."""
    holder = UUID(record.prefect_flow_run_id) if record.prefect_flow_run_id else None
    started = time.monotonic()
    held_when_queued = lease = None
    while lease is None:
        try:
            with signals_deferred():  # a lease taken is also written down, so a later run can give it back
                lease_id = concurrency_limits.try_acquire(need.limit, need.devices, holder)
                if lease_id is not None:
                    lease = QuotaLease(need.limit, need.devices, lease_id, time.monotonic() - started)
                    write_lease_file(record.run_id, lease)
        except BaseException:  # a signal held back while the lease was taken arrives as the block ends
            if lease is not None:
                _give_back(lease, record.run_id)
            raise
        if lease is None:
            if held_when_queued is None:
                current = concurrency_limits.read_limit(need.limit)
                held_when_queued = current.held if current else 0
                logger.warning(
                    "%s; waiting until the team's runs give devices back (`trainflow quota list` "
                    "shows any held by runs that no longer exist)",
                    queued_line(need, held_when_queued, current.devices if current else 0),
                )
            time.sleep(POLL_S)
    return lease, held_when_queued


@lifecycle_task(name="release-quota")
def release_quota(held: HeldQuota) -> None:
    """Give the run's devices back to its team."""
    held.stop.set()
    if held.renewer is not None:
        held.renewer.join(30)
    logger = get_run_logger()
    lease = held.lease
    for delay in (*RELEASE_RETRY_DELAYS_S, None):
        try:
            how, count = give_back_verified(held)
            break
        except Exception as exc:  # noqa: BLE001 - never hide why the run ended; said below
            if delay is None:
                logger.error(
                    "quota %s: could not give back %d devices (%s: %s); `trainflow quota repair %s` "
                    "gives back what runs that no longer exist hold",
                    lease.limit,
                    lease.devices,
                    type(exc).__name__,
                    exc,
                    lease.limit.removeprefix(LIMIT_PREFIX),
                )
                return
            logger.warning(
                "quota %s: giving back %d devices failed (%s); retrying in %g s", lease.limit, lease.devices, exc, delay
            )
            time.sleep(delay)
    remove_lease_file(held.run_id)
    if how == RELEASED:
        logger.info("quota %s: %d devices given back", lease.limit, lease.devices)
    elif how == LOST_LEASE:
        logger.warning(
            "quota %s: %d devices given back directly: the server had lost the run's lease "
            "(restarted) while still counting its devices",
            lease.limit,
            count,
        )
    else:
        logger.warning(
            "quota %s: the server no longer knew the run's lease (it expired) and counts none of its "
            "%d devices: nothing to give back",
            lease.limit,
            lease.devices,
        )


RELEASED, LOST_LEASE, EXPIRED = "released", "lost", "expired"


def _own(held: HeldQuota) -> str | None:
    return str(held.holder) if held.holder else None


def give_back_verified(held: HeldQuota) -> tuple[str, int]:
    """Give the lease's devices back and check that the server did; how, and how many went back:
    RELEASED, LOST_LEASE (the server forgot the lease in a restart but still counted its devices: they
    are taken off directly, as many as it counts beyond the other holding runs') or EXPIRED (the server
    revoked the lease itself, devices included). Raises when it cannot be done."""
    lease = held.lease
    if not concurrency_limits.lease_exists(lease.lease_id):
        counted = concurrency_limits.counted_without_lease(lease.limit, lease.devices, _own(held))
        if counted:
            concurrency_limits.give_back_slots(lease.limit, counted)
            return LOST_LEASE, counted
        return EXPIRED, 0
    concurrency_limits.release(lease.lease_id)
    if concurrency_limits.lease_exists(lease.lease_id):
        raise RuntimeError(f"the server still holds lease {lease.lease_id} after its release")
    return RELEASED, lease.devices


def _give_back(lease: QuotaLease, run_id: str) -> None:
    concurrency_limits.release(lease.lease_id)
    remove_lease_file(run_id)


def give_back_dead_holders(logger) -> None:
    """Slots a dead orchestrator held go back now, not when its lease runs out."""
    for dead in dead_holders():
        concurrency_limits.release(dead.lease_id)
        remove_lease_file(dead.run_id)
        logger.warning(
            "quota %s: gave back %d devices of run %s, whose orchestrator died", dead.limit, dead.devices, dead.run_id
        )


def _renew_until_stopped(held: HeldQuota, logger) -> None:
    while not held.stop.wait(RENEW_EVERY_S):
        try:
            if not concurrency_limits.lease_exists(held.lease.lease_id):
                _lease_again(held, logger)
        except Exception as exc:  # noqa: BLE001 - a missed renewal is retried; the lease outlasts several
            logger.warning("quota %s: lease renewal failed (%s); retrying", held.lease.limit, exc)


def _lease_again(held: HeldQuota, logger) -> None:
    """The server no longer knows the run's lease. Lost in a restart, its devices still count under no
    lease: take them off, then take a new lease for the run; expired, the server gave them back already:
    take a new lease. Until one is taken, the renewal and the release check again."""
    lease = held.lease
    counted = concurrency_limits.counted_without_lease(lease.limit, lease.devices, _own(held))
    if counted:
        concurrency_limits.give_back_slots(lease.limit, counted)
    lease_id = concurrency_limits.try_acquire(lease.limit, lease.devices, held.holder)
    if lease_id is None:
        logger.warning(
            "quota %s: the server lost the run's lease and its %d devices are taken meanwhile; "
            "the run goes on without a lease",
            lease.limit,
            lease.devices,
        )
        return
    held.lease = replace(lease, lease_id=lease_id)
    write_lease_file(held.run_id, held.lease)
    logger.warning(
        "quota %s: the server lost the run's lease (restarted); its %d devices are held under a new one",
        lease.limit,
        lease.devices,
    )
