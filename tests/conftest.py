"""Shared by every test: the project root, the `processes` tier, and no child process outliving the
session.

A test that starts a process or a server (torchrun, spawned ranks, a Python subprocess, Prefect,
moto) carries the `processes` marker: every test in the folders below, and the unit modules listed
here. `--without-processes` runs the rest and fails any of them that starts a process anyway, so
the fast tier stays what it says."""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from pathlib import Path

import psutil
import pytest

pytest_plugins = ["tests.servers"]  # the session's real servers, for every folder that needs them

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

PROCESSES = "processes"
PROCESS_FOLDERS = ("integration", "kubernetes", "lifecycle", "slurm")
PROCESS_UNIT_MODULES = (
    "test_agent_exit.py",
    "test_buddy_copies.py",
    "test_control_cadence.py",
    "test_group_sockets.py",
    "test_code_style.py",
    "test_comm_timer.py",
    "test_ddp_buckets.py",
    "test_environment.py",
    "test_exit_deadline.py",
    "test_import_contracts.py",
    "test_kubernetes_image.py",
    "test_kubernetes_launcher.py",
    "test_kubernetes_manifests.py",
    "test_kubernetes_render.py",
    "test_leave_groups.py",
    "test_leftover_workers.py",
    "test_ledger.py",
    "test_prefect_server.py",
    "test_private_files.py",
    "test_quota.py",
    "test_rank_records.py",
    "test_script_main.py",
    "test_resumable_loader.py",
    "test_soak.py",
    "test_status_limits.py",
    "test_status_relay.py",
    "test_status_scale.py",
    "test_storage.py",
    "test_throttle.py",
    "test_transfer_agent.py",
    "test_warm_head_start.py",
    "test_warm_workers.py",
)


FINISHED_RUNS_READERS = ("test_notebook.py", "test_rerun.py", "test_usage_audit.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--without-processes",
        action="store_true",
        help="run only the tests not marked `processes`, and fail any of them that starts a process",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _starts_processes(item.path):
            item.add_marker(PROCESSES)
    if config.getoption("--without-processes"):
        kept = [item for item in items if item.get_closest_marker(PROCESSES) is None]
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker(PROCESSES)])
        items[:] = kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With workers (`make test`: `-n 2 --dist loadscope`), each takes whole groups of tests, in
    the order they were collected (the long ones first)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid)

    return ByGroup(config, log)


def group(nodeid: str) -> str:
    """The tests one worker runs in a row: a module's tests share its fixtures; the Slurm tests
    share one cluster; the modules that read the session's finished runs share them."""
    path = nodeid.split("::", 1)[0]
    folder, _, rest = path.removeprefix("tests/").partition("/")
    if folder == "slurm":
        return "slurm"
    if folder == "integration" and rest in FINISHED_RUNS_READERS:
        return "finished-runs"
    return path


def _starts_processes(path: Path) -> bool:
    try:
        parts = path.relative_to(TESTS).parts
    except ValueError:
        return False
    return parts[0] in PROCESS_FOLDERS or (parts[0] == "unit" and parts[-1] in PROCESS_UNIT_MODULES)


@pytest.fixture(autouse=True)
def _no_process_in_the_fast_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    if not request.config.getoption("--without-processes"):
        yield
        return
    started: list[str] = []

    def refuse(what: str):
        def start(*args, **kwargs):
            started.append(f"{what}({str(args[0])[:120] if args else ''})")
            raise RuntimeError(f"{request.node.nodeid} starts a process in the tier without processes")

        return start

    monkeypatch.setattr(subprocess, "_fork_exec", refuse("subprocess"))
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse("spawn"))
    for name in ("fork", "posix_spawn", "posix_spawnp"):
        monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    yield
    if started:
        pytest.fail(
            f"starts a process ({started[0]}): add its module to PROCESS_UNIT_MODULES in tests/conftest.py",
            pytrace=False,
        )


def pytest_sessionfinish(session, exitstatus) -> None:
    """Every fixture has been torn down by now. A child still running was left by a test that
    failed half-way; multiprocessing would wait for it at exit and the session would never end.
    Name it and end it (multiprocessing's own resource tracker ends with pytest). With workers
    (`-n`), each worker ends its own; the children of the process that leads them are the workers."""
    if session.config.getoption("numprocesses", None) and not hasattr(session.config, "workerinput"):
        return
    leftovers = [p for p in psutil.Process().children(recursive=True) if not _resource_tracker(p)]
    for process in leftovers:
        try:
            print(f"\ntrainflow tests: ending a leftover process {process.pid}: {' '.join(process.cmdline())[:200]}")
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(leftovers, timeout=10)


def _resource_tracker(process: psutil.Process) -> bool:
    try:
        return "resource_tracker" in " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return True
