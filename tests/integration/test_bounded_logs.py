"""A script that prints a lot does not fill the disk: each node's log keeps its first and last
`tracking.max_node_log_mb` halves, on disk during the run and in MLflow, says what it dropped, and a
failing rank's last stderr lines still make the reason."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import attempt_runs, run_cli, summary_of

pytestmark = pytest.mark.integration

MiB = 2**20
BOUND_MB = 2


def folder_size(folder: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # gone meanwhile
    return total


class PeakSize(threading.Thread):
    """The largest size a folder reached while it was watched."""

    def __init__(self, folder: Path):
        super().__init__(daemon=True)
        self.folder, self.peak, self.done = folder, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.peak = max(self.peak, folder_size(self.folder))


@pytest.mark.timeout(600)
def test_a_script_printing_120_mib_per_rank_stays_within_the_node_log_bound(cli_env, tmp_path):
    runs = Path(cli_env["TRAINFLOW_HOME"]) / "runs"
    watch = PeakSize(runs)
    watch.start()
    try:
        result = run_cli(
            [
                "run",
                "examples/digits/spec.yaml",
                "--json",
                "--set",
                "workload.entrypoint=tests/integration/workloads/loud_output.py",
                "--set",
                "workload.mode=plain",
                "--set",
                "workload.args=[--steps, '60', --mib, '1']",
                "--set",
                f"tracking.max_node_log_mb={BOUND_MB}",
                "--set",
                "fault_tolerance.max_restarts=0",
            ],
            cli_env,
            timeout_s=480,
        )
    finally:
        watch.done.set()
        watch.join()
    assert result.returncode == 1, result.stderr[-4000:]
    summary = summary_of(result)

    # 2 nodes x (60 MiB stdout + 60 MiB stderr) written; the run's folder never held much more than the logs' bound
    assert 0 < watch.peak <= 2 * BOUND_MB * MiB + MiB, f"runs/ peaked at {watch.peak / MiB:.1f} MiB"
    assert "ran out of data after 60 steps" in summary["reason"], summary["reason"]  # the failing rank's stderr tail

    client = MlflowClient(summary["tracking_uri"])
    child = attempt_runs(client, summary)[0]
    downloaded = Path(client.download_artifacts(child.info.run_id, "logs", str(tmp_path)))
    kept = sorted(downloaded.rglob("*"))
    assert folder_size(downloaded) <= 2 * BOUND_MB * MiB + MiB, [
        (p.name, p.stat().st_size) for p in kept if p.is_file()
    ]
    for node in (0, 1):
        text = (downloaded / f"node-{node}.log").read_text(errors="replace")
        assert "bytes of this node's output dropped here" in text
        assert "ran out of data after 60 steps" in text  # the end of the output is kept
    stderr_tails = sorted(p.name for p in (downloaded / "stderr").rglob("local-rank-*"))
    assert stderr_tails == ["local-rank-0", "local-rank-0"]  # one per node, of 16 kB at most
