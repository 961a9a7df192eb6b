"""trainflow.runspec: loading, validation messages, overrides, derived values and the spec hash."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from trainflow.runspec import SpecError, apply_override, load_spec, parse_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits" / "spec.yaml"


@pytest.fixture
def raw() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def spec_error(raw: dict) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    message = str(info.value)
    assert "\n" not in message, "a SpecError is one line"
    return message


def test_example_spec_loads():
    spec = load_spec(EXAMPLE)
    assert spec.name == "digits"
    assert spec.workload.entrypoint == "examples/digits/train.py"
    assert spec.workload.args == ["--lr", "0.05"]
    assert spec.world_size == 2
    assert spec.checkpoint.keep_last == 3


def test_unknown_top_level_key(raw):
    raw["bogus"] = 1
    message = spec_error(raw)
    assert "unknown key" in message and "bogus" in message


def test_unknown_nested_key_names_the_dotted_field(raw):
    raw["resources"]["gpus"] = 1
    message = spec_error(raw)
    assert "resources.gpus: unknown key" in message


def test_several_problems_are_reported_on_one_line(raw):
    raw["bogus"] = 1
    raw["resources"]["nodes"] = 0
    message = spec_error(raw)
    assert "bogus: unknown key" in message and "resources.nodes:" in message


def test_missing_workload(raw):
    del raw["workload"]
    assert "workload: required field is missing" in spec_error(raw)


@pytest.mark.parametrize(
    ("section", "key", "value", "field"),
    [
        ("resources", "nodes", 0, "resources.nodes"),
        ("resources", "procs_per_node", -1, "resources.procs_per_node"),
        ("resources", "memory", "2 GB", "resources.memory"),
        ("checkpoint", "keep_last", 1, "checkpoint.keep_last"),
    ],
)
def test_impossible_field_values_name_the_field(raw, section, key, value, field):
    raw[section][key] = value
    assert f"{field}:" in spec_error(raw)


def test_data_degree_must_match_world_size(raw):
    raw["parallel"]["data"] = 3  # 2 nodes x 1 proc = world 2
    message = spec_error(raw)
    assert "parallel" in message and "world size" in message and "is 2" in message


def test_tensor_degree_must_divide_world_size(raw):
    raw["parallel"]["tensor"] = 3
    message = spec_error(raw)
    assert "tensor × pipeline = 3 does not divide the world size 2" in message


def test_nccl_needs_gpus(raw):
    raw["parallel"]["backend"] = "nccl"
    assert "parallel.backend: nccl needs resources.gpu > 0" in spec_error(raw)


def test_more_processes_than_gpus(raw):
    raw["resources"].update(gpu=1, procs_per_node=2)
    assert "resources.procs_per_node" in spec_error(raw)


@pytest.mark.parametrize("timeout", [2, 1.5])  # interval is 1 s: the timeout must exceed 2 s
def test_heartbeat_timeout_must_exceed_twice_the_interval(raw, timeout):
    raw["fault_tolerance"]["heartbeat_timeout_s"] = timeout
    message = spec_error(raw)
    assert "fault_tolerance" in message and "heartbeat_timeout_s" in message


def test_heartbeat_timeout_just_above_twice_the_interval_is_fine(raw):
    raw["fault_tolerance"]["heartbeat_timeout_s"] = 2.5
    assert parse_spec(raw).fault_tolerance.heartbeat_timeout_s == 2.5


@pytest.mark.parametrize("name", ["Digits", "digits_v2", "-digits", "digits-", ""])
def test_bad_name(raw, name):
    raw["name"] = name
    assert "name:" in spec_error(raw)


def test_file_not_found(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match="spec file not found") as info:
        load_spec(missing)
    assert str(missing) in str(info.value)


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: digits\nworkload: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML") as info:
        load_spec(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_yaml_list_is_not_a_spec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("- name: digits\n")
    with pytest.raises(SpecError, match="YAML mapping"):
        load_spec(path)


def test_validation_error_from_file_names_the_file(tmp_path, raw):
    raw["resources"]["nodes"] = 0
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: ") and "resources.nodes" in str(info.value)


# --- overrides ---------------------------------------------------------------------------------


def test_override_value_is_read_as_yaml_int():
    spec = load_spec(EXAMPLE, ["checkpoint.every_steps=20"])
    assert spec.checkpoint.every_steps == 20
    assert isinstance(spec.checkpoint.every_steps, int)


def test_override_list_value():
    spec = load_spec(EXAMPLE, ["workload.args=[a, b]"])
    assert spec.workload.args == ["a", "b"]


def test_override_creates_nested_keys():
    raw: dict = {}
    apply_override(raw, "a.b.c=1")
    assert raw == {"a": {"b": {"c": 1}}}


def test_override_creates_missing_section_in_spec():
    spec = load_spec(EXAMPLE, ["tracking.uri=sqlite:///x.db"])
    assert spec.tracking.uri == "sqlite:///x.db"


def test_override_of_unknown_key_is_refused():
    with pytest.raises(SpecError, match="resources.bogus: unknown key"):
        load_spec(EXAMPLE, ["resources.bogus=1"])


@pytest.mark.parametrize("item", ["checkpoint.every_steps", "=5"])
def test_override_without_key_or_equals_sign(item):
    with pytest.raises(SpecError, match="expected key.path=value"):
        apply_override({}, item)


def test_override_into_a_value_that_is_not_a_section():
    raw = {"name": "digits"}
    with pytest.raises(SpecError, match="name is not a section"):
        apply_override(raw, "name.first=x")
    assert raw == {"name": "digits"}


def test_override_with_invalid_yaml_value():
    with pytest.raises(SpecError, match="not valid YAML"):
        apply_override({}, "workload.args=[a, b")


def test_overrides_do_not_touch_the_file():
    before = EXAMPLE.read_text()
    load_spec(EXAMPLE, ["checkpoint.every_steps=7"])
    assert EXAMPLE.read_text() == before


# --- derived values ------------------------------------------------------------------------------


def test_data_degree_is_derived_from_world_size(raw):
    raw["resources"].update(nodes=4, procs_per_node=2)
    raw["parallel"].update(tensor=2, pipeline=2)
    assert parse_spec(raw).parallel.data == 2  # 8 / (2 * 2)


def test_explicit_matching_data_degree_is_accepted(raw):
    raw["parallel"]["data"] = 2
    assert parse_spec(raw).parallel.data == 2


def test_spec_hash_is_stable_across_loads():
    first, second = load_spec(EXAMPLE), load_spec(EXAMPLE)
    assert first.spec_hash() == second.spec_hash()
    assert len(first.spec_hash()) == 64


def test_spec_hash_changes_with_any_field():
    base = load_spec(EXAMPLE).spec_hash()
    assert load_spec(EXAMPLE, ["seed=1235"]).spec_hash() != base
    assert load_spec(EXAMPLE, ["checkpoint.keep_last=4"]).spec_hash() != base


def test_spec_hash_same_for_derived_and_explicit_defaults(raw):
    explicit = copy.deepcopy(raw)
    explicit["parallel"]["data"] = 2
    assert parse_spec(explicit).spec_hash() == parse_spec(raw).spec_hash()


def test_comm_backend_auto_is_gloo_on_cpu(raw):
    assert parse_spec(raw).comm_backend() == "gloo"


def test_comm_backend_auto_is_nccl_with_gpus(raw):
    raw["resources"]["gpu"] = 1
    assert parse_spec(raw).comm_backend() == "nccl"


def test_comm_backend_explicit_gloo_with_gpus(raw):
    raw["resources"]["gpu"] = 1
    raw["parallel"]["backend"] = "gloo"
    assert parse_spec(raw).comm_backend() == "gloo"


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("workload", "steps", True, "workload.steps: must be a whole number, not true"),
        ("workload", "steps", "1e29", "workload.steps: must be a whole number"),
        ("workload", "steps", 1e29, "workload.steps: must be a whole number"),
        ("workload", "steps", 10**30, "workload.steps: 1000000000000000000000000000000 is out of range"),
        ("resources", "cpu", "inf", "resources.cpu: must be a number, not 'inf'"),
        ("resources", "cpu", float("inf"), "resources.cpu: must be a finite number"),
        ("resources", "cpu", float("nan"), "resources.cpu: must be a finite number"),
        ("resources", "min_nodes", False, "resources.min_nodes: must be a whole number, not false"),
        ("checkpoint", "every_steps", "10", "checkpoint.every_steps: must be a whole number, not '10'"),
    ],
)
def test_number_fields_take_numbers_only(raw, section, key, value, message):
    raw[section][key] = value
    assert message in spec_error(raw)


def test_a_whole_number_is_a_fine_float(raw):
    raw["resources"]["cpu"] = 1
    assert parse_spec(raw).resources.cpu == 1.0


@pytest.mark.parametrize(
    "uri",
    [
        "ftp://nowhere/x",
        "gs://bucket/x",
        "hdfs://namenode/x",
        "S3://bucket/x",
        "s3:/bucket",
        "s3://ab/x",
        "file://relative/x",
    ],
)
def test_checkpoint_uri_schemes_other_than_local_and_s3_are_refused(raw, uri):
    raw["checkpoint"]["uri"] = uri
    assert f"checkpoint.uri: {uri!r}" in spec_error(raw)


@pytest.mark.parametrize("uri", ["checkpoints/digits", "/tmp/ckpt", "file:///tmp/ckpt", "s3://bucket/prefix"])
def test_local_paths_and_s3_uris_are_accepted(raw, uri):
    raw["checkpoint"]["uri"] = uri
    assert parse_spec(raw).checkpoint.uri == uri


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "is a directory"), (bytes(range(256)), "not a text file")],
)
def test_a_spec_that_is_not_a_yaml_file_is_named(tmp_path, content, message):
    path = tmp_path / "spec"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(SpecError, match=f"{path}: {message}"):
        load_spec(path)


def test_a_plain_scripts_own_checkpoints_need_plain_mode_and_a_folder_for_resume_args(raw):
    raw["workload"]["plain"] = {"checkpoint_dir": "out", "resume_args": ["--init_from=resume"]}
    assert "workload.plain.checkpoint_dir needs workload.mode: plain" in spec_error(raw)
    raw["workload"]["mode"] = "plain"
    assert parse_spec(raw).workload.plain.resume_args == ["--init_from=resume"]
    raw["workload"]["plain"] = {"resume_args": ["--init_from=resume"]}
    assert "workload.plain.resume_args needs workload.plain.checkpoint_dir" in spec_error(raw)


def test_in_process_restart_needs_a_runtime_script_and_no_retry_rules(raw):
    raw["fault_tolerance"]["in_process_restart"] = True
    assert parse_spec(copy.deepcopy(raw)).checkpoint.memory_every_steps is None  # as often as 2% allows
    plain = copy.deepcopy(raw)
    plain["workload"]["mode"] = "plain"
    assert "fault_tolerance.in_process_restart: needs workload.mode runtime" in spec_error(plain)
    ruled = copy.deepcopy(raw)
    ruled["fault_tolerance"]["rules"] = [{"log_pattern": "x", "outcome": "INFRA"}]
    assert "cannot be combined with fault_tolerance.rules" in spec_error(ruled)
    raw["checkpoint"]["memory_every_steps"] = 0
    assert "checkpoint.memory_every_steps" in spec_error(raw)
