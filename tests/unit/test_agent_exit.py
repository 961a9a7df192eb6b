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
    agent = _start_agent(tmp_path, script)
    try:
        worker = _wait_for_pid(agent, pid_file)
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


def test_a_second_sigterm_does_not_cut_the_workers_grace_short_nor_orphan_them(tmp_path):
    # Slurm signals every process of a step, and may again while the agent waits for its workers:
    # the agent must still wait for them (their emergency checkpoint), then leave none behind
    pid_file, saved = tmp_path / "worker.pid", tmp_path / "saved"
    script = tmp_path / "saver.py"
    script.write_text(
        "import os, signal, time\n"
        "def save(*_):\n"
        "    time.sleep(3)\n"
        f"    open({str(saved)!r}, 'w').write('saved')\n"
        "    os._exit(0)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "while True:\n"
        "    time.sleep(1)\n"
    )
    agent = _start_agent(tmp_path, script)
    try:
        worker = _wait_for_pid(agent, pid_file)
        agent.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        agent.send_signal(signal.SIGTERM)
        _, stderr = agent.communicate(timeout=120)
        assert agent.returncode == 128 + signal.SIGTERM, stderr[-3000:]
        assert not _alive(worker), "the agent left its worker behind"
        assert saved.exists(), "the worker's grace was cut short"
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def _start_agent(tmp_path, script) -> subprocess.Popen:
    return subprocess.Popen(
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


def _wait_for_pid(agent: subprocess.Popen, pid_file) -> int:
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()[1][-3000:]
        time.sleep(0.1)
    return int(pid_file.read_text())
