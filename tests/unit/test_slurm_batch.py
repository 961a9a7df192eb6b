"""What an attempt asks Slurm for, and how Slurm's answers are read, without a cluster."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from trainflow.backends.slurm.allocation import SlurmAttempt
from trainflow.backends.slurm.batch import batch_script, memory_mb, sbatch_command
from trainflow.backends.slurm.commands import JobState, parse_key_values, usable
from trainflow.backends.slurm.job_end import SlurmNodeExit, from_job, time_limit_warning
from trainflow.backends.slurm.node_agent import signal_file
from trainflow.orchestrator.failures import Outcome, classify_exit
from trainflow.orchestrator.status import AttemptStatus
from trainflow.runspec import SpecError, parse_spec


def spec(**slurm):
    return parse_spec(
        {
            "name": "job",
            "workload": {"entrypoint": "train.py"},
            "resources": {"backend": "slurm", "nodes": 2, "cpu": 1.5, "memory": "2Gi", "gpu": 1},
            "slurm": slurm,
        }
    )


def test_sbatch_asks_for_the_spec_s_nodes_section_and_excluded_nodes():
    command = sbatch_command(
        spec(
            partition="gpu",
            account="vision",
            qos="high",
            time_limit="1-02:00:00",
            warn_before_limit_s=120,
            constraint="a100",
            exclusive=True,
            sbatch_args=["--reservation=maint"],
        ),
        "run-1",
        Path("/shared/run-1/attempt-2"),
        exclude=["node7"],
    )
    assert command[:2] == ["sbatch", "--parsable"]
    for option in (
        "--job-name=trainflow-run-1",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",
        "--mem=2048M",
        "--gpus-per-node=1",
        "--partition=gpu",
        "--account=vision",
        "--qos=high",
        "--time=1-02:00:00",
        "--signal=TERM@120",
        "--constraint=a100",
        "--exclusive",
        "--exclude=node7",
        "--reservation=maint",
        "--no-requeue",
    ):
        assert option in command
    assert command[-1] == "/shared/run-1/attempt-2/job.sh"


def test_batch_script_runs_one_agent_per_node_with_rendezvous_on_the_first_node():
    script = batch_script(spec(), "run-1", 3, Path("/shared/run-1/attempt-3"))
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in script
    assert "srun --nodes=2 --ntasks-per-node=1" in script
    assert "trainflow.backends.slurm.node_agent /shared/run-1/attempt-3" in script
    assert "TRAINFLOW_RDZV_ENDPOINT=" in script


@pytest.mark.parametrize("quantity, mb", [("2Gi", 2048), ("512Mi", 512), ("1G", 954), ("1.5Gi", 1536)])
def test_memory_quantities_become_slurm_megabytes(quantity, mb):
    assert memory_mb(quantity) == mb


def test_a_bad_time_limit_is_refused_naming_the_field():
    with pytest.raises(SpecError, match="slurm.time_limit"):
        spec(time_limit="an hour")


def test_scontrol_one_line_output_is_read_as_fields():
    fields = parse_key_values("JobId=12 JobName=x JobState=NODE_FAIL Reason=NodeDown ExitCode=0:9 NodeList=n[1-2]")
    assert fields["JobState"] == "NODE_FAIL" and fields["ExitCode"] == "0:9" and fields["NodeList"] == "n[1-2]"


def test_a_job_slurm_ended_says_what_the_nodes_could_not():
    lost = JobState("12", "NODE_FAIL", "NodeDown", "n[1-2]", exit_code=0, exit_signal=9)
    assert from_job(lost)[:2] == (-9, Outcome.NODE_LOST)
    assert from_job(JobState("13", "PREEMPTED", "None", "n1", exit_code=0, exit_signal=15))[1] == Outcome.PREEMPTED
    assert from_job(JobState("14", "FAILED", "NonZeroExitCode", "n1", exit_code=3, exit_signal=0))[:2] == (3, None)


def test_down_and_not_responding_nodes_are_not_usable():
    assert usable("IDLE") and usable("MIXED") and usable("ALLOCATED")
    assert not usable("DOWN*") and not usable("IDLE*") and not usable("DRAINED") and not usable("DOWN")


def test_without_slurm_s_commands_the_spec_is_refused_before_anything_is_provisioned(monkeypatch, tmp_path):
    from trainflow.preflight import preflight

    (tmp_path / "train.py").write_text("import trainflow.runtime as tf\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    with pytest.raises(SpecError, match="resources.backend: slurm needs Slurm's commands on PATH"):
        preflight(spec())
    assert not (tmp_path / "home" / "runs").exists()


def time_limit_handle(tmp_path: Path, signal_line: str | None, signalled_at: float | None = None) -> SlurmAttempt:
    if signal_line is not None:
        signal_file(tmp_path, 0).write_text(signal_line)
    return SlurmAttempt(
        attempt=1,
        nodes=1,
        started_at=0.0,
        logs={},
        job_id="7",
        attempt_dir=tmp_path,
        warn_before_limit_s=10,
        signalled_at=signalled_at,
        limit_ends_at=1000.0,
        job=JobState("7", "RUNNING", "None", "n1", time_limit="00:01:00"),
    )


def test_a_sigterm_in_the_warning_s_window_before_the_time_limit_is_told_apart(tmp_path):
    warning = time_limit_warning(time_limit_handle(tmp_path, "TERM 975.2"), 0)
    assert warning == "slurm job 7: the time limit's warning, SIGTERM 25s before its 00:01:00 limit (--signal=TERM@10)"


@pytest.mark.parametrize(
    "signal_line, signalled_at",
    [
        (None, None),  # no signal reached the node
        ("TERM 975.0", 970.0),  # trainflow's own scancel --signal (a drill)
        ("INT 975.0", None),
        ("TERM 500.0", None),  # long before the warning's window: someone else's SIGTERM
        ("TERM 1003.0", None),  # after the limit: the limit itself, not its warning
    ],
)
def test_other_signals_are_not_taken_for_the_time_limit_s_warning(tmp_path, signal_line, signalled_at):
    assert time_limit_warning(time_limit_handle(tmp_path, signal_line, signalled_at), 0) is None


def test_scontrol_s_end_time_is_read_as_a_local_timestamp():
    from trainflow.backends.slurm.commands import _timestamp

    assert _timestamp("2026-12-01T11:34:05") == datetime(2026, 12, 1, 11, 34, 5).timestamp()
    assert _timestamp("Unknown") is None and _timestamp("None") is None


def test_a_preemption_s_reason_names_the_time_limit_s_warning_slurm_sent():
    warning = "slurm job 7: the time limit's warning, SIGTERM 25s before its 00:01:00 limit (--signal=TERM@10)"
    exits = [SlurmNodeExit(0, 1, outcome=Outcome.PREEMPTED, reason=warning), SlurmNodeExit(1, 1)]
    status = AttemptStatus(attempt=1, preempted={"rank": 0, "step": 56})
    outcome, reason = classify_exit(exits, status)
    assert outcome == Outcome.PREEMPTED
    assert reason == f"preempted (SIGTERM to rank 0): emergency checkpoint at step 56 committed; {warning}"
    assert classify_exit([SlurmNodeExit(0, 1), SlurmNodeExit(1, 1)], status)[1].endswith("step 56 committed")


def test_a_lost_host_is_excluded_until_the_partition_can_hold_the_job_again(monkeypatch, tmp_path):
    from trainflow.backends.slurm import commands
    from trainflow.backends.slurm.allocation import SlurmAllocation
    from trainflow.backends.slurm.launcher import SlurmLauncher

    states = {"n1": "idle", "n2": "allocated", "n3": "down*"}  # n3 is out: no spare for the job's 2 nodes
    monkeypatch.setattr(commands, "partition_nodes", lambda partition: dict(states))
    allocation = SlurmAllocation(run_id="r", backend="slurm", nodes=2, scratch=tmp_path, hosts=["n1", "n2", "n3"])
    launcher = SlurmLauncher()
    assert launcher.replace_node(allocation, 1) is False and allocation.exclude == ["n2"]  # the job shrinks
    states["n3"] = "idle"  # a replacement joined the partition: the job can grow back onto it
    assert launcher.replace_node(allocation, 1) is True and allocation.exclude == ["n2"]


def test_a_drills_host_replaced_later_serves_again_once_the_job_has_shrunk(monkeypatch, tmp_path):
    from trainflow.backends.slurm import commands
    from trainflow.backends.slurm.allocation import SlurmAllocation
    from trainflow.backends.slurm.launcher import SlurmLauncher

    monkeypatch.setattr(commands, "partition_nodes", lambda partition: {"n1": "idle", "n2": "idle"})
    allocation = SlurmAllocation(run_id="r", backend="slurm", nodes=2, scratch=tmp_path, hosts=["n1", "n2"])
    allocation.lost.lose(1, replaced_later=True)
    launcher = SlurmLauncher()
    assert launcher.replace_node(allocation, 1) is False and allocation.exclude == ["n2"]
    assert launcher.replace_node(allocation, 1) is True and allocation.exclude == []
