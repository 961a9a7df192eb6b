"""The upload helper's life beside its rank: a fork waits while the helper is started (no DataLoader
worker inherits the pipes of the start), and the helper ends when its rank does, however it ends."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psutil

from trainflow.checkpoint import transfer_agent


def test_a_fork_waits_while_an_agent_is_being_started():
    order: list[str] = []
    holding, forking = threading.Event(), threading.Event()

    def start_an_agent() -> None:
        with transfer_agent._STARTING:
            holding.set()
            forking.wait(10)
            time.sleep(0.3)  # a fork that did not wait would return in this time
            order.append("started")

    starter = threading.Thread(target=start_an_agent)
    starter.start()
    assert holding.wait(10)
    forking.set()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    order.append("forked")
    os.waitpid(pid, 0)
    starter.join(10)
    assert order == ["started", "forked"]
    assert transfer_agent._STARTING.acquire(timeout=1)  # released in the parent after the fork
    transfer_agent._STARTING.release()


RANK = """
import os, sys, time
from pathlib import Path
from trainflow.checkpoint.transfer_agent import TransferAgent

folder = Path(sys.argv[1])
(folder / "f").write_bytes(b"x")
agent = TransferAgent(str(folder / "store"))
agent.upload_many([(folder / "f", "run/f")])
holder = os.fork()  # as a DataLoader worker would: it keeps the rank's end of the helper's input
if holder == 0:
    time.sleep(120)
    os._exit(0)
print(agent._proc.pid, holder, flush=True)
time.sleep(120)
"""


def test_the_helper_ends_with_its_rank_even_while_a_fork_holds_its_input(tmp_path):
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    helper = holder = None
    try:
        helper, holder = (psutil.Process(int(pid)) for pid in rank.stdout.readline().split())
        assert helper.is_running() and helper.ppid() == rank.pid
        rank.kill()
        rank.wait()
        assert ended(helper, within_s=30), "the helper outlived its rank"
        assert holder.is_running()  # the pipe was still held: the helper left because its rank was gone
    finally:
        rank.kill()
        for proc in (helper, holder):
            if proc is not None and proc.is_running():
                proc.kill()


def ended(proc: psutil.Process, within_s: float) -> bool:
    """Gone or a zombie (an orphan's end is reaped by whoever adopted it, maybe never)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False
