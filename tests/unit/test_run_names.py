"""trainflow.prefect.run_names: a name a person gave a flow run stays; trainflow names the others."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import uuid4

import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext

from trainflow.prefect import run_names
from trainflow.prefect.run_names import given_or, named_by_a_person


def flow_run(name: str, deployment: bool, auto_scheduled: bool = False) -> FlowRun:
    return FlowRun(
        flow_id=uuid4(), name=name, deployment_id=uuid4() if deployment else None, auto_scheduled=auto_scheduled
    )


def test_only_a_run_made_by_hand_from_a_deployment_was_named_by_a_person():
    assert named_by_a_person(flow_run("my try", deployment=True))
    assert not named_by_a_person(flow_run("brave-otter", deployment=True, auto_scheduled=True))  # its schedule
    assert not named_by_a_person(flow_run("brave-otter", deployment=False))  # `trainflow run`, a subflow


@pytest.mark.parametrize(
    "run, expected",
    [
        (flow_run("my try", deployment=True), "my try"),
        (flow_run("brave-otter", deployment=True, auto_scheduled=True), "digits-crash"),
        (flow_run("brave-otter", deployment=False), "digits-crash"),
    ],
)
def test_the_flows_name_template_fills_in_only_what_nobody_named(monkeypatch, run, expected):
    parameters = {"spec": SimpleNamespace(name="digits"), "fault": SimpleNamespace(kind="crash")}
    context = SimpleNamespace(flow_run=run, parameters=parameters)
    monkeypatch.setattr(FlowRunContext, "get", classmethod(lambda cls: context))
    assert given_or("{spec.name}-{fault.kind}")() == expected


class RecordingClient:
    def __init__(self, run: FlowRun):
        self.run, self.calls = run, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read_flow_run(self, flow_run_id):
        assert flow_run_id == self.run.id
        return self.run

    def update_flow_run(self, flow_run_id, tags):
        self.calls.append(("tags", tags))

    def set_flow_run_name(self, flow_run_id, name):
        self.calls.append(("name", name))


def test_the_run_id_names_a_run_nobody_named_and_tags_one_a_person_named(monkeypatch):
    mine = RecordingClient(flow_run("my try", deployment=True).model_copy(update={"tags": ["team:vision"]}))
    monkeypatch.setattr(run_names, "get_client", lambda sync_client: mine)
    assert "kept the name 'my try'" in run_names.name_for_run_id(str(mine.run.id), "digits-1")
    assert mine.calls == [("tags", ["team:vision", "run-id:digits-1"])]

    scheduled = RecordingClient(flow_run("brave-otter", deployment=True, auto_scheduled=True))
    monkeypatch.setattr(run_names, "get_client", lambda sync_client: scheduled)
    run_names.name_for_run_id(str(scheduled.run.id), "digits-2")
    assert scheduled.calls == [("name", "digits-2")]
