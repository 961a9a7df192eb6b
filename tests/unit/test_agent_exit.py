"""torchrun's agent as trainflow starts it (trainflow.backends.agent): stopped by SIGTERM, it ends its
workers and exits 128 + 15, as a shell reports it, so the orchestrator tells a stopped node from one
that failed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.conftest import ROOT


def test_an_agent_stopped_by_sigterm_exits_143_and_ends_its_worker(tmp_path):
    pid_file = tmp_path / "worker.pid"
    script = tmp_path / "sleepy.py"
    script.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainflow.backends.agent",
            "--standalone",
            "--nproc-per-node",
            "1",
            "--monitor-interval",
            "0.1",
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()[1][-3000:]
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        agent.send_signal(signal.SIGTERM)
        _, stderr = agent.communicate(timeout=120)
        assert agent.returncode == 128 + signal.SIGTERM, stderr[-3000:]
        assert "torchrun's agent stopped by SIGTERM" in stderr
        assert not _alive(worker), "the agent ends its worker before it exits"
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie has ended; its reaper may lag
    except psutil.NoSuchProcess:
        return False
