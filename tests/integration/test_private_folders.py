"""Another user of this machine cannot own what a run's workers use, nor read what a run keeps.

The workers' temporary folder used to be `<system temp>/trainflow-<hash of the run id>`, made with
`exist_ok`: a local user who saw the run id could make it first and own what the workers wrote in
it. Here `nobody` makes those old names first (and their node folders, 0777); the workers never use
them, and everything a run keeps under TRAINFLOW_HOME is its owner's alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from trainflow.backends.base import AttemptPlan
from trainflow.backends.job_tmp import PREFIX
from trainflow.backends.local.launcher import LocalLauncher
from trainflow.home import runs_root
from trainflow.runspec import load_spec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser"),
]

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests/integration/workloads/private_tmpdir_probe.py"


def as_nobody(*command: str) -> None:
    subprocess.run(["runuser", "-u", "nobody", "--", *command], check=True, capture_output=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def old_temp_dir(run_id: str) -> Path:
    return Path(tempfile.gettempdir()) / f"trainflow-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}"


@pytest.fixture
def nobodys_folders():
    """The old predictable temporary folders of the run ids used here, made first by `nobody`."""
    made = []

    def make(run_id: str) -> Path:
        folder = old_temp_dir(run_id)
        as_nobody("mkdir", "-p", str(folder / "node-0"), str(folder / "node-1"))
        as_nobody("chmod", "-R", "0777", str(folder))
        made.append(folder)
        return folder

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_workers_never_use_a_temporary_folder_another_user_made(tmp_path, monkeypatch, nobodys_folders, warm):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)
    run_id = f"private-{os.getpid()}-{'warm' if warm else 'cold'}"
    planted = nobodys_folders(run_id)
    spec = load_spec(
        ROOT / "examples/digits/spec.yaml",
        [
            f"workload.entrypoint={PROBE}",
            "workload.mode=plain",
            "workload.args=[]",
            f"resources.warm_workers={str(warm).lower()}",
        ],
    )
    launcher = LocalLauncher()
    allocation = launcher.provision(spec, run_id, runs_root() / run_id)
    try:
        handle = launcher.launch(
            spec,
            allocation,
            AttemptPlan(
                attempt=1, status_address="127.0.0.1:9", status_token="t", code_version="test", restore_prefix=None
            ),
        )
        deadline = time.monotonic() + 240
        while any(e.returncode is None for e in launcher.poll(handle)):
            assert time.monotonic() < deadline, "the probe did not finish"
            time.sleep(0.2)
        logs = {node: path.read_text() for node, path in handle.logs.items()}
        exits = [e.returncode for e in launcher.poll(handle)]
        assert exits == [0, 0], {n: text[-3000:] for n, text in logs.items()}

        temp_dir = allocation.temp_dir
        assert temp_dir != planted and run_id not in temp_dir.name and temp_dir.name.startswith(PREFIX)
        assert (os.lstat(temp_dir).st_uid, mode(temp_dir)) == (0, 0o700)
        left = sorted(p.name for p in temp_dir.glob("node-*/left-by-rank-*"))
        assert left == ["left-by-rank-0", "left-by-rank-1"], logs
        assert all(f"TMPDIR {temp_dir}/node-" in text for text in logs.values()), logs
        for folder in (runs_root(), runs_root() / run_id, runs_root() / run_id / "attempt-1"):
            assert mode(folder) == 0o700, folder
    finally:
        report = launcher.release(allocation)
    assert report.survivors == [] and not allocation.temp_dir.exists()
    assert sorted(p.name for p in planted.rglob("*")) == ["node-0", "node-1"], "the workers wrote into nobody's folder"
