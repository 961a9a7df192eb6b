"""Bad input to `trainflow run` (and `trainflow drill`): exit 2, one line on stderr naming the field or file, and
nothing created: no TRAINFLOW_HOME (so no MLflow run, no run folder), no Prefect server, no process."""

from __future__ import annotations

import json
import os

import pytest

from tests.integration.conftest import processes_of, run_cli
from trainflow.backends.ports import free_port

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"  # 2 nodes
CORES = os.cpu_count() or 1


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _with(*overrides: str) -> list[str]:
    return ["run", SPEC, *[arg for item in overrides for arg in ("--set", item)]]


CASES = {
    "spec is a directory": (lambda tmp: ["run", str(tmp / "a-folder")], "a-folder: is a directory"),
    "spec is a binary file": (lambda tmp: ["run", str(tmp / "model.bin")], "model.bin: not a text file"),
    "ftp scheme": (lambda tmp: _with("checkpoint.uri=ftp://nowhere/x"), "checkpoint.uri: 'ftp://nowhere/x'"),
    "gs scheme": (lambda tmp: _with("checkpoint.uri=gs://bucket/x"), "checkpoint.uri: 'gs://bucket/x'"),
    "hdfs scheme": (lambda tmp: _with("checkpoint.uri=hdfs://namenode/x"), "checkpoint.uri: 'hdfs://namenode/x'"),
    "S3 in capitals": (lambda tmp: _with("checkpoint.uri=S3://bucket/x"), "checkpoint.uri: 'S3://bucket/x'"),
    "s3 with one slash": (lambda tmp: _with("checkpoint.uri=s3:/bucket"), "checkpoint.uri: 's3:/bucket'"),
    # one GPU more per node than this machine shows for the spec's 2 nodes (1 on a machine without any)
    "more GPUs than visible": (lambda tmp: _with(f"resources.gpu={_visible_gpus() // 2 + 1}"), "resources.gpu:"),
    "more cores than the machine": (lambda tmp: _with(f"resources.cpu={max(20, CORES + 1)}"), "resources.cpu:"),
    "64 processes per node": (lambda tmp: _with("resources.procs_per_node=64"), "resources.procs_per_node:"),
    "steps: true": (lambda tmp: _with("workload.steps=true"), "workload.steps: must be a whole number"),
    "steps: 1e29": (lambda tmp: _with("workload.steps=1e29"), "workload.steps: must be a whole number"),
    "steps: 1.0e+29": (lambda tmp: _with("workload.steps=1.0e+29"), "workload.steps: must be a whole number"),
    "cpu: inf": (lambda tmp: _with("resources.cpu=inf"), "resources.cpu: must be a number"),
    "cpu: .inf": (lambda tmp: _with("resources.cpu=.inf"), "resources.cpu: must be a finite number"),
    "another backend's section": (
        lambda tmp: _with("slurm.partition=debug"),
        "slurm: only read with resources.backend: slurm",
    ),
    "a plain script in runtime mode": (
        lambda tmp: _with(f"workload.entrypoint={tmp / 'plain.py'}"),
        "plain.py never imports trainflow.runtime",
    ),
    "a script that does not compile": (
        lambda tmp: _with(f"workload.entrypoint={tmp / 'broken.py'}", "workload.mode=plain"),
        "broken.py:3: SyntaxError:",
    ),
    "a rule's regular expression": (
        lambda tmp: _with("fault_tolerance.rules=[{log_pattern: '(oops', outcome: INFRA}]"),
        "fault_tolerance.rules.0.log_pattern: not a regular expression",
    ),
    "a drill's checkpoint that cannot exist yet": (
        lambda tmp: ["drill", SPEC, "--fault", "corrupt-checkpoint", "--at-step", "30"],  # every_steps: 50
        "--at-step 30: corrupt-checkpoint needs a committed checkpoint before the fault",
    ),
    # tags trainflow writes itself: lineage, the launching user, the run's identity
    "forged parent run": (
        lambda tmp: _with('tracking.tags={"mlflow.parentRunId": "0" }'),
        "tracking.tags: mlflow.parentRunId: reserved",
    ),
    "forged user": (lambda tmp: _with("tracking.tags={mlflow.user: someone}"), "tracking.tags: mlflow.user: reserved"),
    "forged rerun": (lambda tmp: _with("tracking.tags={rerun_of: abc}"), "tracking.tags: rerun_of: reserved"),
    "forged run id": (
        lambda tmp: _with("tracking.tags={trainflow.run_id: x}"),
        "tracking.tags: trainflow.run_id: reserved",
    ),
    "forged status": (lambda tmp: _with("tracking.tags={status: succeeded}"), "tracking.tags: status: reserved"),
    "experiment at an absolute path": (
        lambda tmp: _with(f"tracking.experiment={tmp}/elsewhere"),
        "tracking.experiment: a name, not a path",
    ),
    "experiment up a folder": (
        lambda tmp: _with("tracking.experiment=../x"),
        "tracking.experiment: a name, not a path",
    ),
    "experiment of 5000 characters": (
        lambda tmp: _with("tracking.experiment=" + "e" * 5000),
        "tracking.experiment: 5000 characters",
    ),
    "experiment with a control character": (
        lambda tmp: _with('tracking.experiment="a\\tb"'),
        "tracking.experiment: no control characters",
    ),
    "a key written twice": (
        lambda tmp: ["run", _spec_with_a_key_twice(tmp)],
        "twice.yaml: key 'steps' is written twice",
    ),
}

PLAIN_SCRIPT = "import torch.distributed as dist\n\ndist.init_process_group('gloo')\ndist.destroy_process_group()\n"
BROKEN_SCRIPT = "import trainflow.runtime as tf\n\nfor step in range(3)\n    print(step)\n"


def _spec_with_a_key_twice(folder) -> str:
    text = open(SPEC, encoding="utf-8").read().replace("\n  steps:", "\n  steps: 7\n  steps:", 1)
    assert text.count("steps:") >= 2
    (folder / "twice.yaml").write_text(text)
    return str(folder / "twice.yaml")


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line_and_creates_nothing(tmp_path, case):
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "model.bin").write_bytes(bytes(range(256)) * 16)
    (tmp_path / "plain.py").write_text(PLAIN_SCRIPT)
    (tmp_path / "broken.py").write_text(BROKEN_SCRIPT)
    home, prefect_home = tmp_path / "home", tmp_path / "prefect"
    env = {**os.environ, "TRAINFLOW_HOME": str(home), "PREFECT_HOME": str(prefect_home)}
    env.pop("PREFECT_API_URL", None)  # the embedded default: a temporary server would be started
    args, expected = CASES[case]

    result = run_cli(args(tmp_path), env, timeout_s=120)

    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr[-3000:]
    assert not home.exists(), sorted(str(p) for p in home.rglob("*"))
    assert not prefect_home.exists()
    assert processes_of(home) == []


def _refused(result, expected: str) -> dict:
    """A refusal with --json: exit 2, one line on stderr, and stdout ending with its JSON line."""
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer == {"status": "invalid", "error": lines[0].removeprefix("trainflow: ")}
    return answer


@pytest.mark.parametrize("case", ["spec is a directory", "more cores than the machine"])
def test_bad_input_with_json_ends_stdout_with_an_invalid_status_line(tmp_path, case):
    (tmp_path / "a-folder").mkdir()
    home = tmp_path / "home"
    env = {**os.environ, "TRAINFLOW_HOME": str(home), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    args, expected = CASES[case]

    _refused(run_cli([*args(tmp_path), "--json"], env, timeout_s=120), expected)
    assert not home.exists()


def test_an_unreachable_prefect_server_is_bad_input_and_nothing_is_created(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "TRAINFLOW_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}

    answer = _refused(
        run_cli(["run", SPEC, "--json"], env, timeout_s=120), "PREFECT_API_URL: no Prefect server answers"
    )

    assert "Connection refused" in answer["error"]
    assert not home.exists(), sorted(str(p) for p in home.rglob("*"))  # no checkpoints/, no mlflow.db
    assert processes_of(home) == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", SPEC, "--bogus"], "No such option: --bogus; see 'trainflow run --help'"),
        (["run"], "Missing argument 'SPEC'; see 'trainflow run --help'"),
        (["drill", SPEC, "--at-step", "x"], "Invalid value for '--at-step'"),
    ],
)
def test_options_a_command_does_not_take_are_one_line_and_a_json_line_with_json(tmp_path, args, expected):
    home = tmp_path / "home"
    env = {**os.environ, "TRAINFLOW_HOME": str(home), "PREFECT_HOME": str(tmp_path / "prefect")}

    answer = _refused(run_cli([*args, "--json"], env, timeout_s=120), expected)

    assert answer["status"] == "invalid"
    assert not home.exists()
