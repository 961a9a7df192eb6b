"""A person in the Prefect UI: headless Chromium opens the train deployment, fills the Custom run
form with a changed field, submits it, and a real worker runs the job with that value.

Screenshots of the filled form and the finished run are kept under tests/artifacts/.
"""

from __future__ import annotations

import time

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.integration.deployments import (
    api_json,
    create_flow_run,
    deploy_all,
    deployment,
    process_worker,
    wait_for_flow_run,
)
from tests.integration.webdriver import Browser, ensure_chromium

pytestmark = pytest.mark.integration

ARTIFACTS = ROOT / "tests" / "artifacts"
STEPS = 24  # the reference job's form says 200
RUN_NAME = "steps-24-from-the-form"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    log = tmp_path_factory.mktemp("chromium") / "chromium.log"
    missing = ensure_chromium(log)
    if missing:
        pytest.skip(missing)
    browser = Browser(log)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def served(prefect_api, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ui")
    deploy_all(prefect_api)
    with process_worker(prefect_api, folder / "home", folder / "worker.log") as worker:
        yield {"api": prefect_api, "home": folder / "home", "log": folder / "worker.log", "worker": worker}


def test_custom_run_from_the_ui_trains_with_the_changed_field(browser, served):
    api = served["api"]
    ui = api.removesuffix("/api")
    train = deployment(api, "train")
    started = time.time()

    browser.open(f"{ui}/deployments")
    browser.click(browser.wait_for("a", text="train"))
    browser.click(browser.wait_for("button", text="Run"))
    browser.click(browser.wait_for("button", text="Custom run"))
    steps = browser.labelled_input("Steps")
    assert browser.attribute(steps, "value") == "200"
    # the spec's sections, each with its fields and their descriptions
    labels = browser.script(
        "return [...document.querySelectorAll('.schema-form-property__label')].map(s => s.textContent.trim())"
    )
    for section in [
        "Workload",
        "Resources (Optional)",
        "Parallel (Optional)",
        "Checkpoint (Optional)",
        "Fault Tolerance (Optional)",
        "Tracking (Optional)",
    ]:
        assert section in labels, labels
    browser.wait_for(".schema-form-property__description", text="Total number of training steps of the job.")
    # another backend's own section is folded at its defaults: its name, none of its fields
    assert {"Slurm (Optional)", "Kubernetes (Optional)"} <= set(labels), labels
    assert not {"Partition", "Time limit", "Namespace", "Image", "Tolerations"} & set(labels), labels
    browser.script(
        """[...document.querySelectorAll('.schema-form-property__label')]
             .find(s => s.textContent.trim().startsWith('Kubernetes')).scrollIntoView({block: 'center'});"""
    )
    browser.screenshot(ARTIFACTS / "ui-custom-run-form-backends.png")
    browser.clear(steps)
    browser.type(steps, str(STEPS))
    run_name = browser.wait_for(".flow-run-name-input input")
    browser.clear(run_name)
    browser.type(run_name, RUN_NAME)
    browser.screenshot(ARTIFACTS / "ui-custom-run-form.png")
    browser.click(browser.wait_for("button[type=submit]", text="Submit"))

    deadline = time.monotonic() + 60
    runs = []
    while not runs and time.monotonic() < deadline:
        runs = api_json(
            api,
            "POST",
            "/flow_runs/filter",
            {
                "flow_runs": {"deployment_id": {"any_": [train["id"]]}},
                "sort": "EXPECTED_START_TIME_DESC",
                "limit": 5,
            },
        )
        runs = [r for r in runs if r["parameters"]["spec"]["workload"]["steps"] == STEPS]
        time.sleep(0.5)
    if not runs:  # what the page shows instead (a refusal, a message) goes with the failure
        browser.screenshot(ARTIFACTS / "ui-custom-run-not-created.png")
        page = browser.script("return document.body.innerText")
        pytest.fail(f"the form did not create the flow run; the page reads:\n{page[-3000:]}")
    assert len(runs) == 1, runs
    assert runs[0]["parameters"]["spec"]["name"] == "digits"  # the fields left alone keep their defaults
    assert runs[0]["parameters"]["spec"].get("slurm") is None  # folded: left out, or null
    flow_run = wait_for_flow_run(api, runs[0]["id"], 180, served["worker"], served["log"])
    assert flow_run["state"]["type"] == "COMPLETED", (flow_run["state"], served["log"].read_text()[-4000:])

    client = MlflowClient(f"sqlite:///{served['home'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("digits")
    [run] = client.search_runs([experiment.experiment_id], f"tags.prefect_flow_run_id = '{flow_run['id']}'")
    assert run.data.params["steps"] == str(STEPS)
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == STEPS
    assert run.info.start_time / 1000 >= started - 5
    assert flow_run["name"] == RUN_NAME  # the name typed in the form, and the run id beside it
    assert f"run-id:{run.data.tags['trainflow.run_id']}" in flow_run["tags"]

    browser.open(f"{ui}/runs/flow-run/{flow_run['id']}")
    browser.wait_for("span, div", text="Completed")
    browser.screenshot(ARTIFACTS / "ui-custom-run-completed.png")

    # the run's summary artifact, as the UI renders it
    [summary] = api_json(
        api,
        "POST",
        "/artifacts/filter",
        {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}, "type": {"any_": ["markdown"]}}},
    )
    browser.open(f"{ui}/artifacts/artifact/{summary['id']}")
    browser.wait_for("h1", text=run.data.tags["trainflow.run_id"])
    browser.wait_for("th, td", text=f"succeeded at step {STEPS} of {STEPS}")
    browser.wait_for("a", text=run.info.run_id)  # the link to the MLflow run
    browser.screenshot(ARTIFACTS / "ui-run-summary.png")


def page_shows(browser: Browser, text: str, timeout_s: float = 30) -> bool:
    """Whether the page's text comes to include `text` (inside a longer element's, as a state message is)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in browser.script("return document.body.innerText"):
            return True
        time.sleep(0.3)
    return False


@pytest.mark.timeout(900)  # a baseline and a crashed run that recovers, on a shared 2-core machine
def test_a_crash_drill_shows_the_failed_attempt_and_its_verdict(browser, served):
    api = served["api"]
    ui = api.removesuffix("/api")
    drill = deployment(api, "drill", "fault-drill")
    created = create_flow_run(api, drill["id"], {"fault": {"kind": "crash", "at_step": 30}, "compare_torchrun": False})
    flow_run = wait_for_flow_run(api, created["id"], 600, served["worker"], served["log"])
    assert flow_run["state"]["type"] == "COMPLETED", (flow_run["state"], served["log"].read_text()[-4000:])

    # the faulted run is the drill's subflow: its crashed attempt's task is Failed, with the outcome
    [faulted] = api_json(
        api,
        "POST",
        "/flow_runs/filter",
        {
            "flow_runs": {"parent_flow_run_id": {"any_": [flow_run["id"]]}},
            "flows": {"name": {"any_": ["faulted-lifecycle"]}},
        },
    )
    assert faulted["state"]["type"] == "COMPLETED"
    assert "1 of 2 attempts failed: attempt 1 CRASHED at step" in faulted["state"]["message"]
    tasks = {
        t["name"]: t
        for t in api_json(api, "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [faulted["id"]]}}})
    }
    watch = tasks["watch-attempt-1"]
    assert watch["state"]["type"] == "FAILED" and watch["state"]["message"].startswith("CRASHED at step")
    assert tasks["classify-attempt-1"]["state"]["name"] == "Recovering"
    assert tasks["watch-attempt-2"]["state"]["type"] == "COMPLETED"

    browser.open(f"{ui}/runs/task-run/{watch['id']}")
    browser.wait_for("span, div", text="Failed")
    browser.screenshot(ARTIFACTS / "ui-drill-failed-attempt.png")
    assert page_shows(browser, "CRASHED at step"), browser.script("return document.body.innerText")[:4000]
    browser.open(f"{ui}/runs/flow-run/{faulted['id']}")
    browser.wait_for("span, div", text="Completed")
    browser.screenshot(ARTIFACTS / "ui-drill-faulted-run.png")

    # the drill's verdict, as the UI renders its artifact
    [verdict] = api_json(
        api,
        "POST",
        "/artifacts/filter",
        {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}, "key": {"any_": ["digits-drill-drill-crash"]}}},
    )
    browser.open(f"{ui}/artifacts/artifact/{verdict['id']}")
    browser.wait_for("h1", text="Drill crash: PASSED")
    browser.wait_for("th, td", text="params_match_baseline")
    assert "| params_match_baseline | true |" in verdict["data"]
    browser.screenshot(ARTIFACTS / "ui-drill-verdict.png")
    client = MlflowClient(f"sqlite:///{served['home'] / 'mlflow.db'}")
    [run] = client.search_runs(
        [client.get_experiment_by_name("digits-drill").experiment_id], f"tags.prefect_flow_run_id = '{faulted['id']}'"
    )
    assert run.data.tags["drill_verdict"] == "PASSED" and run.data.tags["drill_params_match_baseline"] == "true"
