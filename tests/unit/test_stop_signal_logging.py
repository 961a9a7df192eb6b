"""A stop signal that lands while SQLAlchemy returns a connection to its pool (MLflow's store) still
stops the command, without SQLAlchemy's traceback in its output."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import create_engine, event, text

from trainflow.cli.signals import quiet_stop_signals_in_pools


def interrupted_return_to_pool(tmp_path, error: BaseException) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'store.db'}")

    @event.listens_for(engine, "reset")
    def reset(dbapi_connection, record, state):
        raise error  # where the signal handler's exception lands

    connection = engine.connect()
    connection.execute(text("select 1"))
    try:
        connection.close()
    finally:
        engine.dispose()


@pytest.mark.parametrize("stop", [KeyboardInterrupt("SIGTERM"), type("TerminationSignal", (BaseException,), {})()])
def test_a_stop_signal_in_a_pool_reset_stops_without_a_logged_traceback(tmp_path, caplog, stop):
    quiet_stop_signals_in_pools()
    with caplog.at_level(logging.ERROR), pytest.raises(type(stop)):
        interrupted_return_to_pool(tmp_path, stop)
    assert [r for r in caplog.records if r.name.startswith("sqlalchemy.pool")] == []


def test_any_other_failure_there_is_still_logged(tmp_path, caplog):
    quiet_stop_signals_in_pools()
    with caplog.at_level(logging.ERROR):
        try:
            interrupted_return_to_pool(tmp_path, RuntimeError("disk gone"))
        except RuntimeError:
            pass
    assert any(r.name.startswith("sqlalchemy.pool") and r.exc_info for r in caplog.records)
