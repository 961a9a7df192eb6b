"""The lifecycle flow under Prefect's test harness (its own temporary server, once per session),
with the scripted in-process backend standing in for `local`."""

from __future__ import annotations

import pytest
from prefect.testing.utilities import prefect_test_harness


@pytest.fixture(scope="session")
def prefect_harness():
    with prefect_test_harness(server_startup_timeout=300):
        yield
