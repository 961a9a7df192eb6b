"""`resources.backend` chooses the backend's own config section (a union keyed by the backend's
name): written where the user always wrote it, typed as that backend's model, and refused on a
spec for another backend unless it only repeats that backend's defaults."""

from __future__ import annotations

import importlib

import jsonschema
import pytest
import yaml
from prefect.utilities.callables import parameter_schema
from typer.testing import CliRunner

from flows.lifecycle import training_lifecycle
from tests.conftest import ROOT
from trainflow.backends.kubernetes.config import KubernetesConfig, kubernetes_config
from trainflow.backends.local.config import LocalConfig, LocalNetwork, local_config
from trainflow.backends.slurm.config import SlurmConfig, slurm_config
from trainflow.cli import EXIT_BAD_INPUT, app
from trainflow.runspec import SpecError, load_spec, parse_spec

LOCAL = ROOT / "examples" / "digits" / "spec.yaml"
K8S = ROOT / "examples" / "specs" / "digits-kubernetes.yaml"
SLURM = ["resources.backend=slurm"]


def refusal(path, overrides) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_each_backend_reads_its_section_into_its_own_model():
    assert local_config(load_spec(LOCAL, ["resources.network=namespaces"])).network == LocalNetwork.namespaces
    slurm = slurm_config(load_spec(LOCAL, [*SLURM, "slurm.partition=debug", "slurm.time_limit='1:00:00'"]))
    assert (slurm.partition, slurm.time_limit) == ("debug", "1:00:00")
    k8s = kubernetes_config(load_spec(K8S))
    assert isinstance(k8s, KubernetesConfig) and k8s.image


def test_a_backend_without_its_section_gets_its_defaults():
    assert load_spec(LOCAL).backend_config == LocalConfig()
    assert load_spec(LOCAL, SLURM).backend_config == SlurmConfig()


def test_the_section_is_typed_as_the_chosen_backends_only():
    with pytest.raises(TypeError, match="resources.backend is local"):
        slurm_config(load_spec(LOCAL))


@pytest.mark.parametrize(
    ("path", "overrides", "message"),
    [
        (
            LOCAL,
            ["slurm.partition=debug"],
            "slurm: only read with resources.backend: slurm, and this spec's backend is local",
        ),
        (LOCAL, ["kubernetes.namespace=team-a"], "kubernetes: only read with resources.backend: kubernetes"),
        (LOCAL, [*SLURM, "resources.network=namespaces"], "resources.network: only read with resources.backend: local"),
        (
            LOCAL,
            [*SLURM, "resources.oversubscribe=true"],
            "resources.oversubscribe: only read with resources.backend: local",
        ),
        (
            K8S,
            ["slurm.exclusive=true"],
            "slurm: only read with resources.backend: slurm, and this spec's backend is kubernetes",
        ),
    ],
)
def test_another_backends_section_is_refused_naming_it(path, overrides, message):
    assert message in refusal(path, overrides)


def test_another_backends_section_at_its_defaults_is_accepted():
    recorded = load_spec(K8S).model_dump(mode="json")  # lists every backend's section, as recorded runs do
    assert recorded["slurm"] == SlurmConfig().model_dump(mode="json", exclude={"backend"})
    assert recorded["resources"]["network"] == "loopback"
    assert parse_spec(recorded) == load_spec(K8S)
    assert load_spec(LOCAL, ["slurm.exclusive=false", "kubernetes.tolerations=[]"]) == load_spec(LOCAL)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["resources.network=wifi"], "resources.network: Input should be 'loopback' or 'namespaces'"),
        ([*SLURM, "slurm.time_limit=soon"], "slurm.time_limit: String should match pattern"),
        ([*SLURM, "slurm.nodelist=a"], "slurm.nodelist: unknown key"),
        (
            ["resources.backend=mesos"],
            "resources.backend: 'mesos' is not a backend; choose one of local, kubernetes, slurm",
        ),
    ],
)
def test_errors_in_a_backend_section_name_the_field_as_written(overrides, field):
    assert field in refusal(LOCAL, overrides)


def test_a_recorded_spec_keeps_its_shape_and_hash():
    spec = load_spec(LOCAL, [*SLURM, "slurm.partition=debug"])
    recorded = yaml.safe_load(spec.to_yaml())
    assert "backend_config" not in recorded and recorded["slurm"]["partition"] == "debug"
    assert "network" in recorded["resources"] and recorded["kubernetes"]["namespace"] == "default"
    assert parse_spec(recorded).spec_hash() == spec.spec_hash()
    assert spec.with_nodes(1).backend_config == spec.backend_config


def test_the_prefect_form_shows_the_sections_as_the_user_writes_them():
    schema = parameter_schema(training_lifecycle.fn).model_dump()
    definitions = schema["definitions"]
    properties = definitions["RunSpec"]["properties"]
    assert "backend_config" not in properties and {"slurm", "kubernetes"} <= set(properties)
    assert "network" in definitions["Resources"]["properties"]
    as_jsonschema = {**schema, "definitions": definitions}
    deployment = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"][0]["parameters"]
    jsonschema.validate(deployment, as_jsonschema)
    jsonschema.validate({"spec": load_spec(LOCAL, SLURM).model_dump(mode="json")}, as_jsonschema)
    with pytest.raises(jsonschema.ValidationError, match="partitions"):
        jsonschema.validate({"spec": {**deployment["spec"], "slurm": {"partitions": "x"}}}, as_jsonschema)


def test_the_prefect_form_folds_each_backends_own_section_until_it_is_chosen():
    schema = parameter_schema(training_lifecycle.fn).model_dump()
    for name in ("slurm", "kubernetes"):
        section = schema["definitions"]["RunSpec"]["properties"][name]
        # the form offers "Defaults" (null, its first choice: where it starts) or the section's fields
        assert section["title"] == name.capitalize() and section["default"] is None
        assert section["anyOf"][0] == {"type": "null", "title": "Defaults"}
        assert section["anyOf"][1]["$ref"].endswith("Config")
    # what the form sends when a section is left at its defaults: that backend's defaults
    sent = load_spec(LOCAL, SLURM).model_dump(mode="json") | {"slurm": None, "kubernetes": None}
    jsonschema.validate({"spec": sent}, schema)
    assert parse_spec(sent).backend_config == SlurmConfig(backend="slurm")
    local = load_spec(LOCAL).model_dump(mode="json") | {"slurm": None, "kubernetes": None}
    assert parse_spec(local).backend_config == load_spec(LOCAL).backend_config


def test_the_cli_refuses_another_backends_section_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["run", str(LOCAL), "--set", "slurm.partition=debug"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "slurm: only read with resources.backend: slurm" in result.output
    assert not (tmp_path / "home").exists()


def test_every_field_of_every_deployed_flows_form_is_described():
    undescribed = []
    for deployment in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]:
        path, name = deployment["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
        schema = parameter_schema(flow.fn).model_dump()
        definitions = schema["definitions"]
        fields = [(key, field) for key, field in schema["properties"].items()]
        for model, definition in definitions.items():
            fields += [(f"{model}.{key}", field) for key, field in definition.get("properties", {}).items()]
        undescribed += [f"{name}: {key}" for key, field in fields if not _described(field, definitions)]
    assert undescribed == []


def _described(field: dict, definitions: dict) -> bool:
    """A description of its own, or its section's (a reference, or a choice of one)."""
    refs = [field.get("$ref")] + [choice.get("$ref") for choice in field.get("anyOf", [])]
    return bool(field.get("description")) or any(
        ref and definitions[ref.split("/")[-1]].get("description") for ref in refs
    )
