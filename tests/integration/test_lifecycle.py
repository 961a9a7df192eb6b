"""The whole lifecycle on real parts: torchrun workers talking gloo, a Prefect server, MLflow on
SQLite, checkpoints in an S3-compatible endpoint over HTTP."""

from __future__ import annotations

import hashlib
import json
import re
import urllib.request

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import (
    BUCKET,
    job_processes,
    run_cli,
    s3_environment,
    summary_of,
    unique_prefix,
)

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
# every checkpoint also a snapshot (by default at most one a minute goes to S3), so retention shows there
STEPS = [
    "--set",
    "workload.steps=40",
    "--set",
    "checkpoint.every_steps=10",
    "--set",
    "checkpoint.keep_last=3",
    "--set",
    "checkpoint.snapshot_every_s=0",
]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, prefect_api, s3_endpoint):
    """One 40-step run checkpointing to S3, shared by the tests that inspect what it left."""
    import os

    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, **s3_environment(s3_endpoint), "TRAINFLOW_HOME": str(home), "PREFECT_API_URL": prefect_api}
    uri = unique_prefix()
    # every step's metrics recorded (by default steps this fast are averaged over 0.1 s)
    every_step = ["--set", "tracking.step_metrics_every_s=0"]
    result = run_cli(["run", SPEC, *STEPS, *every_step, "--set", f"checkpoint.uri={uri}", "--json"], env)
    assert result.returncode == 0, result.stderr[-4000:]
    return {"env": env, "uri": uri, "summary": summary_of(result), "result": result}


def s3_objects(s3, uri: str) -> dict[str, int]:
    prefix = uri.removeprefix(f"s3://{BUCKET}/") + "/"
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def test_run_commits_verified_checkpoints_to_s3(first_run, s3):
    summary = first_run["summary"]
    assert summary["status"] == "succeeded"
    assert summary["final_step"] == 40
    assert [c["step"] for c in summary["checkpoints"]] == [20, 30, 40]  # keep_last=3 of 10, 20, 30, 40
    assert all(c["verified"] and c["uri"].startswith("s3://") for c in summary["checkpoints"])
    assert summary["snapshots_failed"] == []  # retention never ran ahead of the verification

    objects = s3_objects(s3, first_run["uri"])
    manifests = sorted(k for k in objects if k.endswith("/manifest.json"))
    assert [m.split("/")[-2] for m in manifests] == ["step-00000020", "step-00000030", "step-00000040"]
    for key in manifests:
        manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        assert manifest["world_size"] == 2
        assert {f["name"] for f in manifest["files"]} >= {".metadata", "state.json", "rank-0.json", "rank-1.json"}
        folder = key.rsplit("/", 1)[0]
        for entry in manifest["files"]:
            body = s3.get_object(Bucket=BUCKET, Key=f"{folder}/{entry['name']}")["Body"].read()
            assert len(body) == entry["size"]
            assert hashlib.sha256(body).hexdigest() == entry["sha256"]


def test_run_is_recorded_in_mlflow(first_run, tmp_path):
    summary = first_run["summary"]
    client = MlflowClient(summary["tracking_uri"])
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["nodes"] == "2" and params["procs_per_node"] == "1" and params["world_size"] == "2"
    assert params["comm_backend"] == "gloo" and params["strategy"] == "ddp"
    assert (params["dp_degree"], params["tp_degree"], params["pp_degree"]) == ("2", "1", "1")
    assert params["checkpoint_every_steps"] == "10" and params["seed"] == "1234"
    tags = run.data.tags
    assert tags["prefect_flow_run_id"] == summary["prefect_flow_run_id"]
    assert len(tags["spec_hash"]) == 64 and len(tags["env_fingerprint"]) == 64
    assert tags["git_commit"]
    assert tags["params_sha256"] == summary["params_sha256"]
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in loss) == list(range(1, 41))
    assert client.get_metric_history(run.info.run_id, "samples_per_s")
    assert client.get_metric_history(run.info.run_id, "step_time_s")
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "teardown.json", "spec", "checkpoints"} <= artifacts
    spec_text = client.download_artifacts(run.info.run_id, "spec/resolved_spec.yaml", str(tmp_path))
    assert "every_steps: 10" in open(spec_text).read()
    # credentials never reach the tracking store
    everything = json.dumps([params, tags])
    assert s3_environment("x")["AWS_SECRET_ACCESS_KEY"] not in everything
    assert s3_environment("x")["AWS_SECRET_ACCESS_KEY"] not in first_run["result"].stdout


def test_each_stage_is_a_prefect_task_run(first_run, prefect_api):
    flow_run_id = first_run["summary"]["prefect_flow_run_id"]
    with urllib.request.urlopen(f"{prefect_api}/flow_runs/{flow_run_id}") as response:
        flow_run = json.loads(response.read())
    assert flow_run["state"]["type"] == "COMPLETED"
    request = urllib.request.Request(
        f"{prefect_api}/task_runs/filter",
        data=json.dumps({"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        task_runs = json.loads(response.read())
    names = {t["name"] for t in task_runs}  # each named after its stage, and its attempt or step where it repeats
    for stage in [
        "validate-spec",
        "start-tracking",
        "wait-for-quota",
        "provision",
        "prepare-image",
        "launch-attempt-1",
        "watch-attempt-1",
        "release-attempt-1",
        "classify-attempt-1",
        "finalize",
        "teardown",
    ]:
        assert stage in names, (stage, names)
    assert any(name.startswith("snapshot-step-") for name in names), names
    assert all(t["state"]["type"] == "COMPLETED" for t in task_runs)


def test_teardown_leaves_nothing_behind(first_run):
    summary = first_run["summary"]
    assert summary["teardown"]["clean"] is True
    assert summary["teardown"]["released_ports"]
    assert summary["teardown"]["released_standbys"] == 2  # each node's warm standby interpreter
    assert job_processes(summary["run_id"]) == []


def test_every_node_starts_warm(first_run):
    result = first_run["result"]
    assert "attempt 1: 2 node(s) started (2 warm) from step 0" in result.stdout + result.stderr


def test_resume_continues_from_last_committed_step_and_matches_an_uninterrupted_run(first_run, tmp_path):
    env = first_run["env"]
    resumed = run_cli(
        [
            "run",
            SPEC,
            *STEPS,
            "--set",
            "workload.steps=60",
            "--set",
            f"checkpoint.uri={first_run['uri']}",
            "--resume",
            "--json",
        ],
        env,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = summary_of(resumed)
    assert summary["attempts"][0]["resumed_from_step"] == 40
    assert summary["final_step"] == 60
    assert summary["run_id"] != first_run["summary"]["run_id"]

    # the same job without the interruption, on the embedded defaults (temporary Prefect server,
    # local checkpoint folder): resuming must not have changed a single bit of the model
    straight_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    straight_env["TRAINFLOW_HOME"] = str(tmp_path / "straight")
    straight = run_cli(["run", SPEC, *STEPS, "--set", "workload.steps=60", "--json"], straight_env)
    assert straight.returncode == 0, straight.stderr[-4000:]
    assert summary_of(straight)["params_sha256"] == summary["params_sha256"]
    assert (tmp_path / "straight" / "mlflow.db").exists()


def test_resume_from_past_the_specs_last_step_is_bad_input(first_run):
    resumed = run_cli(
        [
            "run",
            SPEC,
            *STEPS,
            "--set",
            "workload.steps=10",
            "--set",
            f"checkpoint.uri={first_run['uri']}",
            "--resume",
            "--json",
        ],
        first_run["env"],
    )
    assert resumed.returncode == 2, resumed.stderr[-4000:]
    lines = resumed.stderr.strip().splitlines()
    # step 40 of the first run, or 60 once the resume test has run
    assert len(lines) == 1 and re.search(
        r"workload.steps: 10, but --resume would continue from step [46]0 ", lines[0]
    ), lines


def test_the_closing_summary_links_the_flow_run_in_the_prefect_ui(first_run, prefect_api):
    summary = first_run["summary"]
    lines = first_run["result"].stdout.splitlines()
    url = f"{prefect_api.removesuffix('/api')}/runs/flow-run/{summary['prefect_flow_run_id']}"
    assert f"  Prefect: {url}" in lines
    page = urllib.request.Request(url, headers={"Accept": "text/html"})  # as a browser asks for it
    with urllib.request.urlopen(page) as response:  # the UI serves the page the link names
        assert response.status == 200 and "<html" in response.read().decode().lower()
    [mlflow] = [line for line in lines if line.startswith("  MLflow: ")]
    assert f" ui --backend-store-uri {summary['tracking_uri']}  (run {summary['mlflow_run_id']})" in mlflow
