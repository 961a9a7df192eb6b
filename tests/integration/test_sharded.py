"""Sharded training through trainflow: FSDP2, tensor parallel and FSDP2 + TP each train to the
end, a crash drill on each resumes bit-identically (params_sha256 over the full parameters, the
same definition whatever the layout), an exception is recovered in place from each rank's memory
copy of its shards and a rank that dies is replaced in place from its copy, a permanent node loss
reshards to fewer ranks and the node's replacement grows the job back, and the spec's layout reaches
the script and is checked against the model it registered."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import attempt_runs, run_cli, s3_environment, summary_of

pytestmark = pytest.mark.integration

SPEC = "examples/fsdp_tp/spec.yaml"
STEPS = 20  # a crash at step 15 resumes from the checkpoint at 10; the run ends at the one at 20
SHORT = [
    "--set",
    f"workload.steps={STEPS}",
    "--set",
    "checkpoint.every_steps=10",
    "--set",
    "tracking.step_metrics_every_s=0",
]
LAYOUTS = {
    "fsdp": ["--set", "parallel.tensor=1"],  # 2 nodes x 2: dp 4
    "tp": ["--set", "resources.nodes=1", "--set", "parallel.strategy=ddp"],  # 1 node x 2: tp 2
    "fsdp_tp": [],  # 2 nodes x 2: dp 2 x tp 2
    "hsdp": ["--set", "parallel.strategy=hybrid", "--set", "parallel.tensor=1"],  # replicate 2 x shard 2
}
can_make_hosts = os.geteuid() == 0 and shutil.which("ip") is not None


@pytest.fixture(scope="module")
def home_env(tmp_path_factory, prefect_api, s3_endpoint):
    """One home for the module, so each layout's drills share one fault-free baseline."""
    home = tmp_path_factory.mktemp("sharded")
    return {**os.environ, **s3_environment(s3_endpoint), "TRAINFLOW_HOME": str(home), "PREFECT_API_URL": prefect_api}


def mlflow_of(env: dict) -> MlflowClient:
    return MlflowClient(f"sqlite:///{Path(env['TRAINFLOW_HOME']) / 'mlflow.db'}")


def drill(env: dict, fault: str, *extra: str) -> dict:
    result = run_cli(
        ["drill", SPEC, "--fault", fault, "--at-step", "15", "--no-compare-torchrun", *SHORT, *extra, "--json"],
        env,
        timeout_s=420,
    )
    report = summary_of(result)
    assert report["injected"], result.stderr[-3000:]
    return report


@pytest.mark.timeout(900)  # a baseline and a faulted run of 4 ranks on a shared 2-core machine
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sharded_layout_trains_to_the_end_and_a_crash_resumes_exactly(home_env, layout):
    report = drill(home_env, "crash", *LAYOUTS[layout])
    baseline = mlflow_of(home_env).get_run(report["baseline_mlflow_run_id"])
    assert baseline.data.tags["status"] == "succeeded"  # the fault-free run trained to the end
    # with 2 processes per node the crashed rank's node-mate reports a peer error too: the cause is
    # still the first rank to fail
    assert report["outcomes"] == ["CRASHED", "SUCCEEDED"], report
    assert report["final_step"] == STEPS
    assert report["params_match_baseline"] is True, report
    assert report["resources_released"] is True


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", ["fsdp_tp", "hsdp"])
def test_an_exception_in_a_sharded_layout_is_recovered_in_place_exactly(home_env, layout):
    report = drill(
        home_env,
        "exception",
        "--set",
        "fault_tolerance.in_process_restart=true",
        "--set",
        "checkpoint.memory_every_steps=1",
        *LAYOUTS[layout],
    )
    assert report["passed"] is True, report["broken_rules"]
    # one attempt: its four rank processes went on, each from its own memory copy of its shards
    assert report["outcomes"] == ["SUCCEEDED"]
    assert (report["ranks_kept"], report["ranks_replaced"]) == (4, 0)
    assert (report["resumed_from_step"], report["lost_steps"]) == (15, 0)
    assert report["params_match_baseline"] is True


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout, fault", [("fsdp_tp", "crash"), ("hsdp", "kill")])
def test_a_rank_that_dies_in_a_sharded_layout_is_replaced_in_place_exactly(home_env, layout, fault):
    report = drill(
        home_env,
        fault,
        "--set",
        "fault_tolerance.in_process_restart=true",
        "--set",
        "checkpoint.memory_every_steps=1",
        *LAYOUTS[layout],
    )
    assert report["passed"] is True, report["broken_rules"]
    # one attempt: three rank processes went on from their own copies of their shards, the fourth
    # was started in place of the dead one and took its copies over from the node's shared memory
    assert report["outcomes"] == ["SUCCEEDED"]
    assert (report["ranks_kept"], report["ranks_replaced"]) == (3, 1)
    assert (report["resumed_from_step"], report["lost_steps"]) == (15, 0)
    assert report["params_match_baseline"] is True


def losses(client: MlflowClient, run_id: str) -> dict[int, float]:
    """Each step's loss as last recorded: a step trained again after a restore is the later attempt's."""
    history = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.timestamp)
    return {m.step: m.value for m in history}


@pytest.mark.timeout(900)
@pytest.mark.skipif(not can_make_hosts, reason="needs root and iproute2 for network namespaces")
def test_a_lost_node_reshards_fsdp_tp_to_fewer_ranks_and_its_replacement_grows_the_job_back(home_env):
    # checkpoints every 5 steps: the shrunken attempt commits one before the end, where it grows back
    report = drill(
        home_env,
        "node-loss",
        "--node",
        "1",
        "--permanent",
        "--replaced-later",
        "--set",
        "resources.min_nodes=1",
        "--set",
        "checkpoint.every_steps=5",
        "--at-step",
        "8",
    )
    assert report["outcomes"] == ["NODE_LOST", "RESIZED", "SUCCEEDED"], report
    assert report["passed"] is True, report["broken_rules"]
    assert report["status"] == "succeeded" and report["final_step"] == STEPS
    client = mlflow_of(home_env)
    attempts = {int(r.data.params["attempt"]): r.data.params for r in attempt_runs(client, report)}
    degrees = {n: (a["world_size"], a["dp_degree"], a["tp_degree"]) for n, a in attempts.items()}
    assert degrees == {1: ("4", "2", "2"), 2: ("2", "1", "2"), 3: ("4", "2", "2")}
    run = client.get_run(report["mlflow_run_id"])
    assert run.data.tags["resizes"] == (
        "attempt 2: world size 4 -> 2 after NODE_LOST; attempt 3: world size 2 -> 4 after RESIZED"
    )
    # the stop to grow back lost nothing: attempt 3 starts at attempt 2's emergency checkpoint
    runs = attempt_runs(client, report)
    resumed = [int(r.data.params["resumed_from_step"]) for r in runs]
    assert resumed[2] == int(runs[1].data.metrics["last_step"]) > resumed[1]
    # the first step after each resize computes the same global batch from the same restored state
    mine, base = losses(client, report["mlflow_run_id"]), losses(client, report["baseline_mlflow_run_id"])
    for step in resumed[1:]:
        assert step + 1 in mine and step + 1 in base, (step, sorted(mine), sorted(base))
        assert mine[step + 1] == pytest.approx(base[step + 1], rel=1e-4, abs=1e-6)


@pytest.mark.timeout(600)
def test_hsdp_replicas_that_diverge_are_caught_and_shards_never_compared(cli_env):
    result = run_cli(
        [
            "run",
            SPEC,
            "--set",
            "workload.entrypoint=tests/integration/workloads/diverge_hsdp.py",
            "--set",
            "workload.args=[--at-step, '25']",
            "--set",
            "parallel.strategy=hybrid",
            "--set",
            "parallel.tensor=1",
            "--set",
            "workload.steps=40",
            "--set",
            "checkpoint.every_steps=10",
            "--set",
            "fault_tolerance.divergence_check_every_steps=10",
            "--json",
        ],
        cli_env,
        timeout_s=420,
    )
    summary = summary_of(result)
    assert [a["outcome"] for a in summary["attempts"]] == ["DIVERGED", "SUCCEEDED"], summary["attempts"]
    assert "diverged at step 30" in summary["attempts"][0]["reason"]
    assert summary["attempts"][1]["resumed_from_step"] == 20
    assert summary["status"] == "succeeded" and summary["final_step"] == 40


def test_fsdp_example_as_hsdp_trains_across_epochs_to_the_end(cli_env):
    result = run_cli(
        [
            "run",
            "examples/fsdp/spec.yaml",
            "--set",
            "parallel.strategy=hybrid",
            "--set",
            "workload.steps=40",
            "--set",
            "checkpoint.every_steps=20",
            "--json",
        ],
        cli_env,
        timeout_s=420,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    assert summary["status"] == "succeeded" and summary["final_step"] == 40  # 28 batches an epoch
    assert [c["step"] for c in summary["checkpoints"]] == [20, 40]
    run = MlflowClient(summary["tracking_uri"]).get_run(summary["mlflow_run_id"])
    assert "layout_warnings" not in run.data.tags  # the model is what the spec declares


def test_declared_layout_the_model_does_not_have_is_a_warning_in_the_run(cli_env):
    # the digits job is plain DDP: declaring fsdp is a contradiction the run must show
    result = run_cli(
        ["run", "examples/digits/spec.yaml", "--set", "workload.steps=20", "--set", "parallel.strategy=fsdp", "--json"],
        cli_env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = summary_of(result)
    run = MlflowClient(summary["tracking_uri"]).get_run(summary["mlflow_run_id"])
    assert "parallel.strategy: fsdp" in run.data.tags["layout_warnings"]
    assert "parallel.strategy: fsdp" in result.stderr + result.stdout


def test_world_size_the_tensor_degree_does_not_divide_is_refused(cli_env):
    result = run_cli(
        ["run", SPEC, "--set", "resources.procs_per_node=3", "--set", "resources.nodes=1"], cli_env, timeout_s=60
    )
    assert result.returncode == 2
    assert "tensor × pipeline = 2 does not divide the world size 3" in result.stderr
