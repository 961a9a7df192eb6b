"""A rule's exclude_node action on a real Slurm cluster: a rank whose last line names a bad device
fails its attempt, and the retry runs in a job without that rank's node (another node takes its
place), resuming from the last checkpoint."""

from __future__ import annotations

import pytest

from tests.integration.conftest import job_processes, run_cli, summary_of
from tests.integration.test_retry_rules import fails_once
from tests.slurm.test_lifecycle import ON_SLURM, SPEC, hostnames, last_run_jobs

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.timeout(600)]


def test_a_rule_excludes_the_node_whose_rank_reported_a_bad_device(slurm_env, slurm_cluster, tmp_path):
    result = run_cli(
        [
            "run",
            SPEC,
            *ON_SLURM,
            *fails_once(tmp_path / "failed-once", 15, "GPU 0: uncorrectable ECC error"),
            "--set",
            "fault_tolerance.rules=[{log_pattern: 'uncorrectable ECC', action: exclude_node}]",
            "--json",
        ],
        slurm_env,
        timeout_s=400,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    attempts = summary["attempts"]
    assert [a["outcome"] for a in attempts] == ["CRASHED", "SUCCEEDED"], [a["reason"] for a in attempts]
    assert (
        "fault_tolerance.rules[0] (log /uncorrectable ECC/ -> exclude_node) matched rank 1 on node 1"
        in (attempts[0]["reason"])
    ), attempts[0]["reason"]
    assert attempts[1]["resumed_from_step"] == 10
    failed, retried = last_run_jobs(slurm_cluster)
    bad_host = hostnames(failed["NodeList"])[1]  # node 1 of the first job ran rank 1
    assert bad_host not in hostnames(retried["NodeList"]), (failed["NodeList"], retried["NodeList"])
    assert len(hostnames(retried["NodeList"])) == 2  # excluded, not shrunk: another node took its place
    assert job_processes(summary["run_id"]) == []
