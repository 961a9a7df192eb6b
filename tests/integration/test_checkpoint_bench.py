"""`trainflow bench checkpoint` runs end to end and reports every figure; what the figures are is
the benchmark's business, never a test's."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.integration.conftest import run_cli
from trainflow.backends.ports import is_listening

pytestmark = pytest.mark.integration

FIGURES = [
    "sync_stall_s",
    "async_stall_s",
    "local_write_MBps",
    "s3_upload_MBps",
    "raw_boto3_upload_MBps",
    "s3_restore_MBps",
    "raw_boto3_download_MBps",
    "verify_s",
    "step_overhead_pct",
]


def test_bench_checkpoint_reports_every_figure_and_stops_its_own_s3(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # no endpoint: it starts its own
    result = run_cli(["bench", "checkpoint", "--size-mb", "8", "--json"], env, timeout_s=600)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    for name in FIGURES:
        assert isinstance(figures[name], (int, float)), name
    assert figures["checkpoint_bytes"] >= 8 << 20 and figures["failed_saves"] == 0
    assert "moto_server started by the benchmark" in figures["endpoint"]
    assert set(figures["targets"]) == {"async_stall", "upload", "restore", "step_overhead"}
    assert all(isinstance(t["met"], bool) for t in figures["targets"].values())
    assert "async stall" in result.stdout and "targets:" in result.stdout
    port = int(re.search(r"127\.0\.0\.1:(\d+)", figures["endpoint"]).group(1))
    assert not is_listening(port)  # its server is gone
