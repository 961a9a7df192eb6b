"""trainflow's temporary Prefect server: how long it may take to start, and a start that fails."""

from __future__ import annotations

import psutil
import pytest

from trainflow.prefect.server import STARTUP_TIMEOUT_ENV, ServerError, TemporaryServer, startup_timeout_s


def test_the_start_up_timeout_is_generous_and_prefects_setting_overrides_it(monkeypatch):
    monkeypatch.delenv(STARTUP_TIMEOUT_ENV, raising=False)
    assert startup_timeout_s() == 300
    monkeypatch.setenv(STARTUP_TIMEOUT_ENV, "900")
    assert startup_timeout_s() == 900


def test_a_server_that_does_not_answer_in_time_is_stopped_and_the_error_says_what_to_do():
    server = TemporaryServer()
    with pytest.raises(ServerError, match=f"did not answer within 0 s \\(raise {STARTUP_TIMEOUT_ENV}"):
        server.start(timeout_s=0)
    assert server.process is None
    assert [c for c in psutil.Process().children() if "trainflow.prefect.server" in " ".join(c.cmdline())] == []
