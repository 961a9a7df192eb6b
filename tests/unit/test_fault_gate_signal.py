"""A rank held at a drill's fault gate notes when a preemption's SIGTERM reached it, and the
injector keeps the gate shut until one has (trainflow.runtime.fault_gate, trainflow.drills.chaos)."""

from __future__ import annotations

import threading
import time

from trainflow.backends import AttemptHandle
from trainflow.drills.chaos import wait_for_signal
from trainflow.runtime.fault_gate import wait_for_fault
from trainflow.worker_config import fault_gate_path, gate_arrival_path, gate_signal_path


class Running:
    def poll(self) -> None:
        return None


def test_the_gate_stays_shut_until_a_rank_saw_its_sigterm(tmp_path):
    gate = fault_gate_path(tmp_path, 1)
    signalled = threading.Event()
    rank = threading.Thread(target=wait_for_fault, args=(gate, 1, 30), kwargs={"signalled": signalled.is_set})
    rank.start()
    try:
        handle = AttemptHandle(attempt=1, nodes=2, started_at=time.time(), logs={}, processes={0: Running()})
        assert not wait_for_signal(gate, handle, world_size=2, timeout_s=0.3), "no signal yet"
        assert gate_arrival_path(gate, 1).read_text() == "30" and not gate_signal_path(gate, 1).exists()
        signalled.set()  # what the rank's SIGTERM handler does
        assert wait_for_signal(gate, handle, world_size=2, timeout_s=30)
        assert gate_signal_path(gate, 1).read_text() == "30"
        assert rank.is_alive(), "the rank waits at the gate until the drill opens it"
    finally:
        gate.touch()
        rank.join(10)
    assert not rank.is_alive()


def test_an_attempt_that_ended_stops_the_wait(tmp_path):
    class Ended:
        def poll(self) -> int:
            return 1

    handle = AttemptHandle(attempt=1, nodes=1, started_at=time.time(), logs={}, processes={0: Ended()})
    began = time.monotonic()
    assert not wait_for_signal(fault_gate_path(tmp_path, 1), handle, world_size=1, timeout_s=600)
    assert time.monotonic() - began < 300, "it returned because the attempt ended, not at its deadline"
