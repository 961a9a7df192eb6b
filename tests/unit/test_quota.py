"""trainflow.quota: which limit a run counts against, how much it asks, and which leases a dead
orchestrator left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainflow.quota import (
    QuotaError,
    QuotaLease,
    QuotaNeed,
    QuotaNeedOfRun,
    acquired_line,
    dead_holders,
    lease_folder,
    limit_name,
    need_of_parameters,
    queued_line,
    remove_lease_file,
    stale_slots,
    write_lease_file,
)
from trainflow.runspec import load_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits" / "spec.yaml"


def test_a_run_counts_its_world_size_against_its_teams_limit():
    need = QuotaNeed.of(load_spec(EXAMPLE, ["tracking.tags={team: vision}", "resources.procs_per_node=2"]))
    assert need == QuotaNeed(team="vision", limit="trainflow-team-vision", devices=4)


def test_a_run_without_a_team_uses_the_default_pool():
    assert QuotaNeed.of(load_spec(EXAMPLE)).limit == "trainflow-team-default"


def test_a_team_name_prefect_or_kueue_would_refuse_names_the_tag():
    with pytest.raises(QuotaError, match=r"^tracking.tags.team: team 'Vision Team': use lower-case"):
        QuotaNeed.of(load_spec(EXAMPLE, ["tracking.tags={team: Vision Team}"]))
    with pytest.raises(QuotaError):
        limit_name("-x")


def test_a_run_larger_than_the_whole_limit_is_told_how_to_fix_it():
    need = QuotaNeed(team="vision", limit="trainflow-team-vision", devices=4)
    assert need.too_large(4) is None
    message = need.too_large(2)
    assert message.startswith("resources: the run needs 4 devices")
    assert "trainflow quota set vision --devices 4" in message and "\n" not in message


def test_the_lines_a_queued_run_prints():
    need = QuotaNeed(team="x", limit="trainflow-team-x", devices=2)
    assert queued_line(need, 2, 2) == "queued for quota trainflow-team-x: needs 2 devices, 2/2 held"
    assert (
        acquired_line(need, 2, 2, 12.4) == "queued for quota trainflow-team-x: needs 2 devices, 2/2 held, waited 12 s"
    )
    assert acquired_line(need, 4, None, 0.01) == "quota trainflow-team-x: holds 2 of 4 devices"


def test_only_leases_of_dead_orchestrators_are_given_back(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path))
    lease = QuotaLease(limit="trainflow-team-x", devices=2, lease_id="1f0c", waited_s=0.0)
    write_lease_file("alive-run", lease)  # this process: alive
    dead = subprocess.run(
        [sys.executable, "-c", "import os, psutil; p = psutil.Process(); print(p.pid, p.create_time())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid, started = dead.stdout.split()
    (lease_folder() / "dead-run.json").write_text(
        json.dumps(
            {
                "limit": "trainflow-team-x",
                "devices": 2,
                "lease_id": "9a7e",
                "waited_s": 0.0,
                "run_id": "dead-run",
                "pid": int(pid),
                "pid_started": float(started),
            }
        )
    )
    (lease_folder() / "torn.json").write_text("{")  # half-written: skipped, not fatal
    assert [(holder.run_id, holder.lease_id) for holder in dead_holders()] == [("dead-run", "9a7e")]
    remove_lease_file("alive-run")
    assert not (lease_folder() / "alive-run.json").exists()


def test_stale_devices_are_what_a_limit_holds_beyond_its_holding_runs():
    spec = load_spec(EXAMPLE, ["tracking.tags={team: vision}"]).model_dump(mode="json")
    holders = [need_of_parameters("a", {"spec": spec}), need_of_parameters("b", {"spec": {"resources": {"nodes": 1}}})]
    assert holders[0] == QuotaNeedOfRun("a", "trainflow-team-vision", 2)
    assert holders[1] == QuotaNeedOfRun("b", "trainflow-team-default", 1)
    stale = stale_slots({"trainflow-team-vision": 5, "trainflow-team-default": 0}, holders)
    assert stale["trainflow-team-vision"].stale == 3 and stale["trainflow-team-default"].stale == 0
    unreadable = need_of_parameters("c", {"spec": "not a spec"})
    assert unreadable.limit is None and stale_slots({"trainflow-team-vision": 5}, [*holders, unreadable]) is None
