"""prefect.yaml against a real Prefect server and a real process worker: deploy everything, check
what the UI will show (typed parameter form, nightly schedule), trigger runs through the REST API
the UI uses, and check what they leave in MLflow and in the Prefect UI (artifacts, events)."""

from __future__ import annotations

import copy
import http.server
import json
import re
import subprocess
import threading
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.integration.conftest import BIN, run_cli
from tests.integration.deployments import (
    POOL,
    api_call,
    api_json,
    create_flow_run,
    deploy_all,
    deployment,
    prefect_env,
    process_worker,
    wait_for_flow_run,
)

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def deployed(prefect_api, tmp_path_factory):
    """Everything in prefect.yaml deployed, and a process worker serving trainflow-local."""
    folder = tmp_path_factory.mktemp("deployments")
    home, log = folder / "home", folder / "worker.log"
    deploy_all(prefect_api)
    nightly = deployment(prefect_api, "train-nightly")
    with process_worker(prefect_api, home, log) as worker:
        yield {"api": prefect_api, "home": home, "log": log, "worker": worker, "nightly": nightly}


def run_deployment(
    deployed, name: str, parameters: dict, flow: str = "training-lifecycle", run_name: str | None = None
) -> dict:
    target = deployment(deployed["api"], name, flow)
    created = create_flow_run(deployed["api"], target["id"], parameters, run_name)
    return wait_for_flow_run(deployed["api"], created["id"], RUN_TIMEOUT_S, deployed["worker"], deployed["log"])


def mlflow_run_of(deployed, flow_run_id: str):
    client = MlflowClient(f"sqlite:///{deployed['home'] / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, filter_string=f"tags.prefect_flow_run_id = '{flow_run_id}'")
    assert len(runs) == 1, runs
    return client, runs[0]


def events_of(api: str, flow_run_id: str, until: str, timeout_s: float = 30) -> list[dict]:
    """trainflow's events about a flow run, once `until` is among them (the server stores events in batches)."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = api_json(
            api,
            "POST",
            "/events/filter",
            {
                "filter": {"event": {"prefix": ["trainflow."]}, "related": {"id": [f"prefect.flow-run.{flow_run_id}"]}},
                "limit": 50,
            },
        )["events"]
        if any(e["event"] == until for e in events) or time.monotonic() > deadline:
            return events
        time.sleep(0.5)


def test_every_deployment_runs_this_checkout_through_the_local_pool(deployed):
    api = deployed["api"]
    for flow, name, entrypoint in [
        ("training-lifecycle", "train", "flows/lifecycle.py:training_lifecycle"),
        ("training-lifecycle", "train-nightly", "flows/lifecycle.py:training_lifecycle"),
        ("rerun", "rerun", "flows/rerun.py:rerun_training"),
        ("fault-drill", "drill", "flows/drill.py:fault_drill"),
    ]:
        found = deployment(api, name, flow)
        assert found["entrypoint"] == entrypoint
        assert found["work_pool_name"] == POOL
        assert found["enforce_parameter_schema"] is True
        assert found["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
    assert api_json(api, "GET", f"/work_pools/{POOL}")["type"] == "process"


def test_production_runs_are_taken_before_research_runs(deployed):
    api = deployed["api"]
    queues = api_json(api, "POST", f"/work_pools/{POOL}/queues/filter", {})
    priority = {queue["name"]: queue["priority"] for queue in queues}
    assert priority["production"] == 1 and priority["research"] == 2, priority
    assert deployment(api, "train-nightly")["work_queue_name"] == "production"
    for flow, name in [("training-lifecycle", "train"), ("rerun", "rerun"), ("fault-drill", "drill")]:
        assert deployment(api, name, flow)["work_queue_name"] == "research"


def test_the_kubernetes_pool_is_made_from_the_referenced_base_job_template(deployed):
    definitions = yaml.safe_load((ROOT / "prefect.yaml").read_text())["definitions"]
    pool = definitions["work_pools"]["kubernetes"]["name"]
    template = ROOT / definitions["base_job_templates"][pool]
    result = subprocess.run(
        [
            str(BIN / "prefect"),
            "work-pool",
            "create",
            pool,
            "--type",
            "kubernetes",
            "--base-job-template",
            str(template),
            "--overwrite",
        ],
        cwd=ROOT,
        env=prefect_env(deployed["api"]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    created = api_json(deployed["api"], "GET", f"/work_pools/{pool}")
    assert created["type"] == "kubernetes"
    assert created["base_job_template"] == json.loads(template.read_text())


def test_train_parameters_are_a_typed_form_of_the_spec_sections(deployed):
    schema = deployment(deployed["api"], "train")["parameter_openapi_schema"]
    assert schema["required"] == ["spec"]
    assert schema["properties"]["spec"]["$ref"] == "#/definitions/RunSpec"
    definitions = schema["definitions"]
    run_spec = definitions["RunSpec"]
    assert run_spec["description"].startswith("A training job")
    sections = {
        "workload": "Workload",
        "resources": "Resources",
        "parallel": "Parallel",
        "checkpoint": "Checkpoint",
        "fault_tolerance": "FaultTolerance",
        "tracking": "Tracking",
    }
    for field, model in sections.items():
        assert run_spec["properties"][field]["$ref"] == f"#/definitions/{model}"
        assert definitions[model]["description"], model  # the section's explanation above its fields
        assert definitions[model]["additionalProperties"] is False
    steps = definitions["Workload"]["properties"]["steps"]
    assert (steps["title"], steps["type"], steps["exclusiveMinimum"]) == ("Steps", "integer", 0)
    assert steps["description"] == "Total number of training steps of the job."
    assert definitions["Resources"]["properties"]["nodes"]["title"] == "Nodes"
    assert definitions["Backend"]["enum"] == ["local", "kubernetes", "slurm"]  # a choice in the form
    assert definitions["Strategy"]["enum"] == ["ddp", "fsdp", "hybrid"]
    assert "pattern" in run_spec["properties"]["name"]
    drill = deployment(deployed["api"], "drill", "fault-drill")["parameter_openapi_schema"]["definitions"]
    assert "crash" in drill["FaultKind"]["enum"] and "preempt" in drill["FaultKind"]["enum"]
    # the form opens filled with the reference job
    spec = deployment(deployed["api"], "train")["parameters"]["spec"]
    assert spec["workload"]["entrypoint"] == "examples/digits/train.py" and spec["seed"] == 1234


def test_train_nightly_runs_on_its_cron_schedule(deployed):
    nightly = deployed["nightly"]
    [schedule] = nightly["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *"
    assert schedule["schedule"]["timezone"] == "UTC"
    assert schedule["active"] is True
    assert nightly["parameters"]["spec"]["name"] == "digits-nightly"
    assert nightly["parameters"]["spec"]["tracking"]["experiment"] == "digits-nightly"
    assert nightly["parameters"]["spec"]["workload"]["entrypoint"] == "examples/digits/train.py"


def test_bad_parameters_are_refused_before_a_run_exists(deployed):
    api = deployed["api"]
    train = deployment(api, "train")
    spec = train["parameters"]["spec"]
    before = api_json(api, "POST", "/flow_runs/count", {"deployments": {"id": {"any_": [train["id"]]}}})
    for path, bad in [(("workload", "steps"), 0), (("resources", "backend"), "mesos"), (("resources", "nodes"), "two")]:
        wrong = copy.deepcopy(spec)
        wrong[path[0]][path[1]] = bad
        status, answer = api_call(
            api, "POST", f"/deployments/{train['id']}/create_flow_run", {"parameters": {"spec": wrong}}
        )
        assert status == 409, (path, status, answer)
        assert ".".join(path) in answer["detail"], answer
    after = api_json(api, "POST", "/flow_runs/count", {"deployments": {"id": {"any_": [train["id"]]}}})
    assert after == before


@pytest.fixture(scope="module")
def train_run(deployed, tmp_path_factory):
    """One manual run of `train` through the REST API the UI uses, with a changed spec: a workload
    whose rank 1 exits at step 15 the first time, so the run fails over once and recovers."""
    spec = copy.deepcopy(deployment(deployed["api"], "train")["parameters"]["spec"])
    spec.update(name="deployed")
    marker = tmp_path_factory.mktemp("fail-once") / "failed"
    spec["workload"] = {
        "entrypoint": "tests/integration/workloads/fail_once.py",
        "steps": 30,
        "args": ["--fail-at-step", "15", "--marker", str(marker)],
    }
    spec["checkpoint"].update(every_steps=10, uri="checkpoints/deployed")
    spec["tracking"]["experiment"] = "deployments"
    flow_run = run_deployment(deployed, "train", {"spec": spec}, run_name="fails over once")
    return {"flow_run": flow_run, "spec": spec}


def test_train_completes_on_the_worker_and_is_recorded_in_mlflow(deployed, train_run):
    flow_run = train_run["flow_run"]
    assert flow_run["state"]["type"] == "COMPLETED", (flow_run["state"], deployed["log"].read_text()[-4000:])
    client, run = mlflow_run_of(deployed, flow_run["id"])
    assert flow_run["name"] == "fails over once"  # the name the person gave it, with the run id beside it
    assert f"run-id:{run.data.tags['trainflow.run_id']}" in flow_run["tags"]
    assert run.data.tags["trainflow.run_id"].startswith("deployed-")
    assert run.info.status == "FINISHED"
    assert run.data.params["steps"] == "30" and run.data.params["checkpoint_every_steps"] == "10"
    assert run.data.tags["status"] == "succeeded"
    assert len(run.data.tags["params_sha256"]) == 64
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert max(m.step for m in loss) == 30


def test_the_run_shows_progress_a_summary_and_events_in_prefect(deployed, train_run):
    api, flow_run_id = deployed["api"], train_run["flow_run"]["id"]
    _, run = mlflow_run_of(deployed, flow_run_id)
    artifacts = api_json(api, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
    by_type = {a["type"]: a for a in artifacts}
    assert by_type["progress"]["key"] == "deployed-progress"
    assert by_type["progress"]["data"] == 100
    assert by_type["progress"]["description"] == "succeeded: attempt 2: step 30 of 30"
    summary = by_type["markdown"]
    assert summary["key"] == "deployed-summary"
    for expected in [
        "| Status | succeeded at step 30 of 30 |",
        "| Attempt | Outcome",
        "| 1 | CRASHED | 2 | 0 → ",
        "| 2 | SUCCEEDED | 2 |",
        "Goodput",
        f"/runs/{run.info.run_id})",
        "## Checkpoints",
        "| 30 |",
    ]:
        assert expected in summary["data"], (expected, summary["data"])

    events = events_of(api, flow_run_id, until="trainflow.run.succeeded")
    names = [e["event"] for e in events]
    assert "trainflow.run.succeeded" in names and "trainflow.run.failed" not in names
    committed = [e["payload"]["step"] for e in events if e["event"] == "trainflow.checkpoint.committed"]
    assert 30 in committed, committed
    failed = next(e for e in events if e["event"] == "trainflow.attempt.failed")
    assert (failed["payload"]["attempt"], failed["payload"]["outcome"], failed["payload"]["retry"]) == (
        1,
        "CRASHED",
        True,
    )
    recovered = next(e for e in events if e["event"] == "trainflow.attempt.recovered")
    assert recovered["payload"]["attempt"] == 2 and recovered["payload"]["recovery_s"] > 0
    finished = next(e for e in events if e["event"] == "trainflow.run.succeeded")
    assert finished["resource"]["prefect.resource.id"] == f"trainflow.run.{run.data.tags['trainflow.run_id']}"
    related = {r["prefect.resource.id"]: r["prefect.resource.role"] for r in finished["related"]}
    assert related[f"prefect.flow-run.{flow_run_id}"] == "flow-run"
    assert related[f"mlflow.run.{run.info.run_id}"] == "mlflow-run"
    assert finished["payload"]["params_sha256"] == run.data.tags["params_sha256"]
    assert finished["payload"]["attempts"] == 2


def test_rerun_deployment_repeats_the_faulted_run_bit_for_bit(deployed, train_run):
    _, original = mlflow_run_of(deployed, train_run["flow_run"]["id"])
    # allow_drift: people may edit the checkout between the two runs; refusing drift is test_rerun's subject
    parameters = {"mlflow_run_id": original.info.run_id, "allow_drift": True}
    flow_run = run_deployment(deployed, "rerun", parameters, flow="rerun")
    assert flow_run["state"]["type"] == "COMPLETED", (flow_run["state"], deployed["log"].read_text()[-4000:])
    client = MlflowClient(f"sqlite:///{deployed['home'] / 'mlflow.db'}")
    [rerun] = client.search_runs([original.info.experiment_id], f"tags.rerun_of = '{original.info.run_id}'")
    assert rerun.info.run_id != original.info.run_id
    assert rerun.data.tags["rerun_of"] == original.info.run_id
    assert "rerun_drift" in rerun.data.tags
    assert rerun.data.tags["spec_hash"] == original.data.tags["spec_hash"]
    assert rerun.data.tags["params_sha256"] == original.data.tags["params_sha256"]
    # the lifecycle is a subflow of the rerun flow: it names the deployment its parent was started from
    assert (rerun.data.tags["launched_via"], rerun.data.tags["prefect_deployment"]) == ("deployment", "rerun")
    assert rerun.data.tags["rerun_allow_drift"] == "true"


def test_audit_of_a_deployment_run_names_the_deployment_and_its_events(deployed, train_run):
    flow_run_id = train_run["flow_run"]["id"]
    _, run = mlflow_run_of(deployed, flow_run_id)
    events_of(deployed["api"], flow_run_id, until="trainflow.run.succeeded")  # stored by the server by now
    result = run_cli(
        ["audit", run.info.run_id, "--tracking-uri", f"sqlite:///{deployed['home'] / 'mlflow.db'}", "--json"],
        prefect_env(deployed["api"]),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trail = json.loads(result.stdout.strip().splitlines()[-1])
    assert trail["origin"]["launched_via"] == "deployment" and trail["origin"]["prefect_deployment"] == "train"
    assert trail["origin"]["launched_by_user"] and trail["origin"]["launched_from_host"]
    assert trail["identity"]["prefect_flow_run_id"] == flow_run_id
    assert [a["outcome"] for a in trail["attempts"]] == ["CRASHED", "SUCCEEDED"]
    events = [e["event"] for e in trail["events"]]
    assert "prefect.flow-run.Running" in events and "trainflow.run.succeeded" in events, events
    # each event names what it is about as a person would: the task run, not its UUID
    resources = {e["resource"] for e in trail["events"]}
    assert not [r for r in resources if re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-", r)], resources
    assert {"watch-attempt-1", "watch-attempt-2"} <= resources, resources


def test_usage_report_deployment_publishes_the_usage_table(deployed, train_run):
    found = deployment(deployed["api"], "usage-report", "usage-report")
    [schedule] = found["schedules"]
    assert (schedule["schedule"]["cron"], schedule["active"]) == ("0 6 * * 1", True)
    flow_run = run_deployment(deployed, "usage-report", {"by": "experiment", "since": "1d"}, flow="usage-report")
    assert flow_run["state"]["type"] == "COMPLETED", (flow_run["state"], deployed["log"].read_text()[-4000:])
    [artifact] = api_json(
        deployed["api"],
        "POST",
        "/artifacts/filter",
        {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}, "type": {"any_": ["markdown"]}}},
    )
    assert artifact["key"] == "usage-report"
    client = MlflowClient(f"sqlite:///{deployed['home'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("deployments")
    lifecycles = [r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    hours = sum(r.data.metrics["summary/device_hours"] for r in lifecycles)
    [row] = [line for line in artifact["data"].splitlines() if line.startswith("| deployments |")]
    assert f"| {len(lifecycles)} |" in row and f"| {hours:.4f} |" in row and "CRASHED" in row, row
    assert "data:image/png;base64," in artifact["data"]


class Webhook(http.server.BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Webhook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_failure_automation_notifies_a_webhook(deployed):
    api = deployed["api"]
    server = http.server.HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        env = prefect_env(api)
        for _ in range(2):  # installing again replaces it
            result = run_cli(["automation", "install", "--webhook-url", url, "--json"], env, timeout_s=60)
            assert result.returncode == 0, result.stderr[-3000:]
        assert url not in result.stdout  # a webhook URL can hold a token
        installed = json.loads(result.stdout.strip().splitlines()[-1])
        automations = api_json(api, "POST", "/automations/filter", {})
        mine = [a for a in automations if a["name"] == "trainflow-failures"]
        assert len(mine) == 1 and mine[0]["id"] == installed["automation_id"]
        assert set(mine[0]["trigger"]["expect"]) == {"trainflow.attempt.failed", "trainflow.run.failed"}

        # a failed attempt, as the lifecycle reports it
        emit = (
            "from prefect.events import emit_event; "
            "emit_event('trainflow.attempt.failed', "
            "resource={'prefect.resource.id': 'trainflow.run.webhook-probe', "
            "'prefect.resource.name': 'webhook-probe'}, "
            "payload={'attempt': 1, 'outcome': 'CRASHED', 'reason': 'node 1 exited with code 1', 'retry': True, "
            "'mlflow_run_id': 'abc123', 'mlflow_url': 'http://127.0.0.1:5000/#/experiments/1/runs/abc123', "
            "'prefect_url': 'http://127.0.0.1:4200/runs/flow-run/f-1'})"
        )
        subprocess.run([str(BIN / "python"), "-c", emit], env=env, check=True, timeout=60, capture_output=True)
        deadline = time.monotonic() + 60
        while not Webhook.received and time.monotonic() < deadline:
            time.sleep(0.5)
        assert Webhook.received, "no notification reached the webhook within 60 s"
        message = Webhook.received[0]
        assert message["subject"] == "trainflow: trainflow.attempt.failed (webhook-probe)"
        assert "attempt 1: CRASHED" in message["text"] and "node 1 exited with code 1" in message["text"]
        assert "MLflow run: http://127.0.0.1:5000/#/experiments/1/runs/abc123" in message["text"]
        assert "Prefect flow run: http://127.0.0.1:4200/runs/flow-run/f-1" in message["text"]
    finally:
        server.shutdown()
