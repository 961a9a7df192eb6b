"""wait-for-quota / release-quota: a run holds its team's devices from before provision until after teardown.

A run that would take its team past its limit waits here, saying so in its log (the Prefect UI and
`trainflow run`'s output) and recording how long in MLflow (`quota_wait_s`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from uuid import UUID

from prefect import get_run_logger
from prefect.settings import PREFECT_API_URL

from tasks import lifecycle_task
from tasks import quota_api
from tasks.records import RunRecord
from trainflow.orchestrator.interrupts import signals_deferred
from trainflow.quota import (
    TEMPORARY_SERVER_ENV, QuotaError, QuotaLease, QuotaNeed, acquired_line, dead_holders, queued_line,
    remove_lease_file, write_lease_file,
)
from trainflow.reporting.tracking import Tracker

POLL_S = 2.0  # how often a queued run asks again; the server's Retry-After can be far longer
RENEW_EVERY_S = quota_api.LEASE_S / 4


@dataclass
class HeldQuota:
    """A lease and the thread that keeps renewing it while the run lives."""

    run_id: str
    lease: QuotaLease
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
    limit = quota_api.read_limit(need.limit)
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
        Tracker(record.tracking_uri).log_metrics(record.mlflow_run_id,
                                                 [("quota_wait_s", round(lease.waited_s, 3), 0, time.time())])
        held = HeldQuota(run_id=record.run_id, lease=lease)
        held.renewer = threading.Thread(target=_renew_until_stopped, args=(held, logger), daemon=True,
                                        name=f"quota-lease-{lease.lease_id[:8]}")
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
                lease_id = quota_api.try_acquire(need.limit, need.devices, holder)
                if lease_id is not None:
                    lease = QuotaLease(need.limit, need.devices, lease_id, time.monotonic() - started)
                    write_lease_file(record.run_id, lease)
        except BaseException:  # a signal held back while the lease was taken arrives as the block ends
            if lease is not None:
                _give_back(lease, record.run_id)
            raise
        if lease is None:
            if held_when_queued is None:
                current = quota_api.read_limit(need.limit)
                held_when_queued = current.held if current else 0
                logger.warning("%s; waiting until the team's runs give devices back",
                               queued_line(need, held_when_queued, current.devices if current else 0))
            time.sleep(POLL_S)
    return lease, held_when_queued


@lifecycle_task(name="release-quota")
def release_quota(held: HeldQuota) -> None:
    """Give the run's devices back to its team."""
    held.stop.set()
    if held.renewer is not None:
        held.renewer.join(30)
    logger = get_run_logger()
    try:
        quota_api.release(held.lease.lease_id)
    except Exception as exc:  # noqa: BLE001 - never hide why the run ended; the lease runs out by itself
        logger.error("quota %s: could not give back %d devices (%s); they return when the lease expires "
                     "(%g s) or the next run gives them back", held.lease.limit, held.lease.devices, exc,
                     quota_api.LEASE_S)
        return
    remove_lease_file(held.run_id)
    logger.info("quota %s: %d devices given back", held.lease.limit, held.lease.devices)


def _give_back(lease: QuotaLease, run_id: str) -> None:
    quota_api.release(lease.lease_id)
    remove_lease_file(run_id)


def give_back_dead_holders(logger) -> None:
    """Slots a dead orchestrator held go back now, not when its lease runs out."""
    for dead in dead_holders():
        quota_api.release(dead.lease_id)
        remove_lease_file(dead.run_id)
        logger.warning("quota %s: gave back %d devices of run %s, whose orchestrator died",
                       dead.limit, dead.devices, dead.run_id)


def _renew_until_stopped(held: HeldQuota, logger) -> None:
    while not held.stop.wait(RENEW_EVERY_S):
        try:
            quota_api.renew(held.lease.lease_id)
        except Exception as exc:  # noqa: BLE001 - a missed renewal is retried; the lease outlasts several
            logger.warning("quota %s: lease renewal failed (%s); retrying", held.lease.limit, exc)

