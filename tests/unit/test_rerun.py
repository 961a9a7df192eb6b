"""trainflow.repro.rerun: what counts as drift between a recorded run and this checkout, and how it is told."""

from __future__ import annotations

from dataclasses import replace

from trainflow.repro import rerun
from trainflow.repro.environment import Environment
from trainflow.repro.rerun import (
    SHOWN_PACKAGES,
    Lineage,
    RecordedRun,
    code_snapshot,
    current_lineage,
    detect_drift,
    package_drift,
    refusal,
    rerunning,
)
from trainflow.runspec import parse_spec

PACKAGES = {"torch": "2.13.0+cpu", "numpy": "2.4.6", "mlflow": "3.17.2", "trainflow": "0.1.0"}
COMMIT = "a" * 40
CODE = {"workload_sha256": "w" * 64, "git_diff_sha256": "d" * 64, "lock_sha256": "l" * 64, "platform": "Linux-x86_64"}


def environment(**changes) -> Environment:
    env = Environment(
        python="3.11.7",
        torch="2.13.0+cpu",
        platform="Linux-x86_64",
        packages=dict(PACKAGES),
        git_commit=COMMIT,
        git_dirty=False,
        lock_sha256="l" * 64,
        fingerprint="f" * 64,
    )
    return replace(env, **changes)


def recorded(**tag_changes) -> RecordedRun:
    spec = parse_spec({"name": "digits", "seed": 7, "workload": {"entrypoint": "examples/digits/train.py"}})
    tags = {
        "env_fingerprint": "f" * 64,
        "git_commit": COMMIT,
        "git_dirty": "false",
        "python_version": "3.11.7",
        "torch_version": "2.13.0+cpu",
        **CODE,
        "trainflow.run_id": "digits-20260101-000000-abcdef",
    }
    tags.update(tag_changes)
    return RecordedRun("0123456789abcdef0123456789abcdef", "sqlite:///x.db", spec, tags, dict(PACKAGES), "p" * 64)


def test_nothing_drifts_when_code_and_environment_match():
    assert detect_drift(recorded(), environment(), dict(CODE)) == []


def test_a_new_commit_is_code_drift():
    drift = detect_drift(recorded(), environment(git_commit="b" * 40, fingerprint="g" * 64), dict(CODE))
    assert drift == [f"code: commit {'a' * 12} was recorded, {'b' * 12} is checked out"]


def test_uncommitted_changes_are_code_drift():
    drift = detect_drift(recorded(), environment(git_dirty=True, fingerprint="g" * 64), dict(CODE))
    assert drift == ["code: the run had a clean tree, this checkout has uncommitted changes"]
    # both dirty: the changes themselves must be the same
    dirty = recorded(git_dirty="true")
    assert detect_drift(dirty, environment(git_dirty=True), dict(CODE)) == []
    other_changes = {**CODE, "git_diff_sha256": "e" * 64}
    assert detect_drift(dirty, environment(git_dirty=True), other_changes) == [
        "code: the uncommitted changes to the code differ from the recorded run's (git diff HEAD)"
    ]


def test_an_edited_training_script_is_code_drift():
    drift = detect_drift(recorded(), environment(), {**CODE, "workload_sha256": "v" * 64})
    assert drift == [
        f"code: the training script examples/digits/train.py changed (sha256 {'w' * 12} recorded, {'v' * 12} here)"
    ]


def test_interpreter_platform_and_lock_changes_are_environment_drift():
    env = environment(python="3.11.9", platform="Linux-aarch64", lock_sha256="m" * 64, fingerprint="g" * 64)
    drift = detect_drift(recorded(), env, dict(CODE))
    assert drift == [
        "environment: Python 3.11.7 was recorded, 3.11.9 is here",
        "environment: platform Linux-x86_64 was recorded, Linux-aarch64 is here",
        "environment: requirements.lock differs from the recorded run's",
    ]


def test_package_differences_are_listed_one_by_one():
    installed = {**PACKAGES, "numpy": "2.5.0", "extra": "1.0", "trainflow": "0.2.0"}
    del installed["mlflow"]
    assert package_drift(PACKAGES, installed) == [
        "environment: package extra 1.0 is installed here but was not in the recorded run",
        "environment: package mlflow 3.17.2 was recorded but is not installed here",
        "environment: package numpy 2.4.6 was recorded, 2.5.0 is installed here",
    ]  # trainflow itself is the code, compared by commit


def test_many_package_differences_are_counted_after_the_first_few():
    installed = {**PACKAGES, **{f"pkg{i:02d}": "1.0" for i in range(SHOWN_PACKAGES + 5)}}
    lines = package_drift(PACKAGES, installed)
    assert len(lines) == SHOWN_PACKAGES + 1
    assert lines[-1] == "environment: and 5 more package differences"


def test_a_different_fingerprint_alone_is_still_drift():
    drift = detect_drift(recorded(), environment(fingerprint="g" * 64), dict(CODE))
    assert drift == [f"environment: fingerprint {'f' * 12} was recorded, {'g' * 12} is here"]


def test_runs_recorded_without_the_code_snapshot_compare_what_they_have():
    old = recorded()
    for tag in CODE:
        old.tags.pop(tag)
    assert detect_drift(old, environment(), {**CODE, "workload_sha256": "v" * 64}) == []


def test_refusal_names_the_run_every_difference_and_the_way_out():
    message = refusal(recorded(), ["code: one", "environment: two"])
    assert message.startswith("refusing to rerun 0123456789abcdef0123456789abcdef (digits-20260101-000000-abcdef)")
    assert "\n  - code: one\n  - environment: two\n" in message
    assert "--allow-drift" in message and "make venv" in message


def test_reruns_carry_their_lineage_only_inside_the_block():
    assert current_lineage() is None
    lineage = Lineage(rerun_of="abc", drift=("environment: two",))
    with rerunning(lineage):
        assert current_lineage() is lineage
    assert current_lineage() is None
    assert lineage.tags() == {"rerun_of": "abc", "rerun_drift": "true", "rerun_allow_drift": "false"}
    assert Lineage(rerun_of="abc").tags()["rerun_drift"] == "false"
    assert Lineage(rerun_of="abc", drift=lineage.drift, allow_drift=True).tags()["rerun_allow_drift"] == "true"


def test_code_snapshot_hashes_the_script_and_the_uncommitted_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(rerun, "uncommitted_changes_sha256", lambda root=None: "d" * 64)
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    spec = parse_spec({"name": "digits", "workload": {"entrypoint": str(script)}})
    snapshot = code_snapshot(spec)
    assert snapshot["git_diff_sha256"] == "d" * 64
    assert len(snapshot["workload_sha256"]) == 64 and len(snapshot["lock_sha256"]) == 64
    script.write_text("print('changed')\n")
    assert code_snapshot(spec)["workload_sha256"] != snapshot["workload_sha256"]
    script.unlink()
    assert code_snapshot(spec)["workload_sha256"] == "missing"
