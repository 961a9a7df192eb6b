"""Around every command that runs a flow: SIGTERM unwinds like Ctrl-C (so teardown runs), the exit
code says which signal stopped it, and a Prefect API outlives the flow's teardown."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager

import typer

from trainflow.cli.output import EXIT_FAILED
from trainflow.prefect.server import (
    STARTUP_TIMEOUT_ENV,
    STARTUP_TIMEOUT_S,
    ServerError,
    TemporaryServer,
    startup_timeout_s,
)
from trainflow.quota import TEMPORARY_SERVER_ENV
from trainflow.reporting.audit import VIA_CLI, launched_via

# SQLAlchemy's pools (MLflow's store) log, with a traceback, an exception that interrupts returning a
# connection to the pool: a stop signal landing there would print one, though the run stops cleanly
POOL_LOGGERS = tuple(
    f"sqlalchemy.pool.impl.{pool}"
    for pool in ("QueuePool", "AsyncAdaptedQueuePool", "SingletonThreadPool", "NullPool", "StaticPool", "AssertionPool")
)


class StopSignalInPool(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, KeyboardInterrupt) and type(exc).__name__ != "TerminationSignal"  # Prefect's


def quiet_stop_signals_in_pools() -> None:
    for name in POOL_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, StopSignalInPool) for f in logger.filters):
            logger.addFilter(StopSignalInPool())


def stop_on_sigterm() -> None:
    """SIGTERM (a scheduler, `kill`) unwinds like Ctrl-C, so teardown still runs."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)


@contextmanager
def orchestrating():
    """Around every command that runs a flow: SIGTERM unwinds like Ctrl-C, the exit code says which
    signal stopped it, and the Prefect API outlives the flow's teardown."""
    # the temporary server's telemetry writes race the flow's own writes to its SQLite database
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # should Prefect start a temporary server of its own after all, a busy host gets time to start it
    os.environ.setdefault(STARTUP_TIMEOUT_ENV, str(STARTUP_TIMEOUT_S))
    stop_on_sigterm()
    quiet_stop_signals_in_pools()
    with _exit_on_signal(), _prefect_api(), launched_via(VIA_CLI):
        yield


@contextmanager
def _exit_on_signal():
    """A run stopped by a signal (its teardown done) exits 128 + the signal's number, saying so."""
    try:
        yield
    except BaseException as exc:
        signum = _stopping_signal(exc)
        if signum is None:
            raise
        typer.echo(f"trainflow: interrupted ({signal.Signals(signum).name})", err=True)
        raise typer.Exit(128 + signum) from None


def _stopping_signal(exc: BaseException) -> int | None:
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGTERM if str(exc) == "SIGTERM" else signal.SIGINT
    if "prefect" in sys.modules:
        from prefect.exceptions import TerminationSignal  # Prefect's own SIGTERM handler, while a flow runs

        if isinstance(exc, TerminationSignal):
            return exc.signal
    return None


@contextmanager
def _prefect_api():
    """PREFECT_API_URL's server, or a temporary one of trainflow's own: in its own session, so the
    terminal's Ctrl-C does not end it before teardown has reported; gone with this process."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    server = TemporaryServer()
    # MLflow's import (a second or more) overlaps the server's start-up, which would otherwise only be waited for
    importing = threading.Thread(target=_import_tracking, name="import-tracking", daemon=True)
    importing.start()
    try:
        server.start(startup_timeout_s())
        importing.join()
    except ServerError as exc:
        typer.echo(f"trainflow: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    # in the environment before prefect is imported, so every thread it starts sees this server
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ[TEMPORARY_SERVER_ENV] = "1"  # team quotas need the server the runs share
    try:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):  # if it was imported already
            yield
    finally:
        _drain_prefect_workers()
        os.environ.pop("PREFECT_API_URL", None)
        os.environ.pop(TEMPORARY_SERVER_ENV, None)
        server.stop()


def _import_tracking() -> None:
    try:
        import trainflow.reporting.tracking  # noqa: F401 - imported for the flow, which needs it next
    except Exception:  # noqa: BLE001 - the flow's own import says what is wrong
        pass


def _drain_prefect_workers() -> None:
    """Prefect sends logs and events from background workers: they go before the server does."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=30)
