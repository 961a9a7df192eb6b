"""torchrun's stores on a live job: every listener of the job is on loopback, never on every
interface (c10d's store has no authentication), and the rendezvous port cannot be taken between
its choice and its use: node 0's agent serves the store on the socket its launcher bound."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.integration.conftest import run_cli, summary_of
from trainflow.backends.base import NodeExit
from trainflow.backends.store_sockets import LISTEN_FD_ENV, listening_socket
from trainflow.backends.torchrun_report import log_tail
from trainflow.contracts import Outcome
from trainflow.orchestrator.rules import match_rules
from trainflow.orchestrator.status import AttemptStatus
from trainflow.runspec import FaultTolerance

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"
EVERYWHERE = {"0.0.0.0", "::", ""}
TWO_RANKS = (
    "import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\ndist.destroy_process_group()\n"
)


def job_listeners(home: str) -> dict[tuple[str, int], str]:
    """(address, port) -> command line, for every listening TCP socket of the processes of this home."""
    commands = {}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.environ().get("TRAINFLOW_HOME") == home:
                commands[proc.pid] = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
    return {
        (c.laddr.ip, c.laddr.port): commands[c.pid]
        for c in psutil.net_connections(kind="inet")
        if c.pid in commands and c.status == psutil.CONN_LISTEN
    }


def ss_listeners() -> str:
    return subprocess.run(["ss", "-ltnp"], capture_output=True, text=True, check=False).stdout


@pytest.mark.parametrize("warm", [True, False])
def test_a_live_job_listens_on_loopback_only(cli_env, tmp_path, warm):
    home = cli_env["TRAINFLOW_HOME"]
    gate = tmp_path / "gate"
    gate.mkdir()
    args = [
        "run",
        SPEC,
        "--set",
        "workload.entrypoint=tests/integration/workloads/pause_until_released.py",
        "--set",
        f"workload.args=[--pause-at-step, '3', --paused, '{gate / 'paused'}', --release, '{gate / 'release'}']",
        "--set",
        "workload.steps=6",
        "--set",
        f"resources.warm_workers={str(warm).lower()}",
        "--set",
        "fault_tolerance.hang_timeout_s=900",
        "--json",
    ]
    seen: dict = {}

    def look_while_paused() -> None:
        deadline = time.monotonic() + 400
        while not (gate / "paused").exists():
            assert time.monotonic() < deadline, "the job never reached its pause"
            time.sleep(0.2)
        seen["listeners"] = job_listeners(home)
        seen["ss"] = ss_listeners()
        (gate / "release").touch()

    looker = threading.Thread(target=look_while_paused, daemon=True)
    looker.start()
    try:
        result = run_cli(args, cli_env, timeout_s=600)
    finally:
        (gate / "release").touch()
        looker.join(timeout=30)
    assert result.returncode == 0, result.stderr[-4000:]
    assert summary_of(result)["status"] == "succeeded"
    listeners = seen["listeners"]
    # node 0's agent hosts both stores (rendezvous, workers'); the ranks listen for gloo's pairs
    assert len(listeners) >= 4, (listeners, seen["ss"])
    assert [a for a in listeners if a[0] in EVERYWHERE] == [], seen["ss"]
    assert {address for address, _ in listeners} == {"127.0.0.1"}, seen["ss"]


def agent(tmp_path: Path, node: int, port: int, script: Path, listen_fd: int | None = None) -> subprocess.Popen:
    env = {**os.environ}
    if listen_fd is not None:
        env[LISTEN_FD_ENV] = str(listen_fd)
    with open(tmp_path / f"node-{node}.log", "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainflow.backends.agent",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "race",
                "--rdzv-conf",
                f"is_host={'true' if node == 0 else 'false'},join_timeout=60",
                "--max-restarts",
                "0",
                "--monitor-interval",
                "0.1",
                "--local-addr",
                "127.0.0.1",
                "--log-dir",
                str(tmp_path / f"torchrun-{node}"),
                str(script),
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(listen_fd,) if listen_fd is not None else (),
        )


def thief(port: int) -> socket.socket | None:
    """Another program on the host taking the port, as a server does (SO_REUSEADDR, listening)."""
    try:
        return listening_socket("127.0.0.1", port)
    except OSError:
        return None


def finish(procs: list[subprocess.Popen]) -> list[int]:
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=180))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    return codes


def test_the_rendezvous_port_cannot_be_taken_between_its_choice_and_its_use(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    # as the local launcher does: bound and listening before the number is handed to anyone
    listener = listening_socket("127.0.0.1")
    port = listener.getsockname()[1]
    with listener:
        procs = [agent(tmp_path, 0, port, script, listener.fileno()), agent(tmp_path, 1, port, script)]
    assert thief(port) is None, "a port handed out is held from its choice to its use"
    assert finish(procs) == [0, 0], (tmp_path / "node-0.log").read_text()[-3000:]


def test_a_rendezvous_port_taken_before_the_agent_listens_is_infra_and_retried(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    # where the port is chosen in one place and listened on in another (a cluster's batch script,
    # a node in its own network namespace), something can take it in between
    with listening_socket("127.0.0.1") as chosen:
        port = chosen.getsockname()[1]
    taken = thief(port)
    assert taken is not None
    with taken:
        [code] = finish([agent(tmp_path, 0, port, script)])
    assert code == 1
    evidence = NodeExit(0, code, log_tail=tuple(log_tail(tmp_path / "node-0.log")))
    assert any(f"127.0.0.1:{port} cannot be listened on" in line for line in evidence.log_tail), evidence.log_tail
    match = match_rules(FaultTolerance(), [evidence], AttemptStatus(attempt=1))
    assert match is not None and match.name == "built-in rule 'port already in use'"
    assert match.rule.outcome == Outcome.INFRA and Outcome.INFRA in FaultTolerance().retry_on
