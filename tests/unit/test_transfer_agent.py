"""Starting the upload helper from the background save's thread while the training thread forks:
the fork waits, so no forked process (a DataLoader worker) inherits the pipes of the start."""

from __future__ import annotations

import os
import threading
import time

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
