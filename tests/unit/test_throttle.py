"""The straggler drill's throttle freezes a rank while it works on the CPU, never while it waits."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainflow.drills.throttle import on_cpu, throttle, throttle_in_own_process


@pytest.fixture
def process(request):
    proc = subprocess.Popen([sys.executable, "-c", f"print(flush=True)\n{request.param}"], stdout=subprocess.PIPE)
    proc.stdout.readline()  # started: what it does from now on is its parameter
    yield proc
    proc.kill()
    proc.wait()


def state(proc) -> str:
    with open(f"/proc/{proc.pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def signal_to(proc):
    return lambda sig: os.kill(proc.pid, sig)


@pytest.mark.parametrize("process", ["import time; time.sleep(60)"], indirect=True)
def test_a_process_that_waits_is_never_frozen(process):
    assert throttle(signal_to(process), process.pid, 0.3, lambda: True) == 0
    assert process.poll() is None


@pytest.mark.parametrize("process", ["while True: pass"], indirect=True)
def test_a_process_that_computes_is_frozen_and_left_running(process):
    assert throttle(signal_to(process), process.pid, 0.3, lambda: True) >= 1
    assert state(process) != "T"  # not left stopped
    assert process.poll() is None


@pytest.mark.parametrize("process", ["pass"], indirect=True)
def test_a_process_that_ended_ends_the_throttle(process):
    process.wait()
    with pytest.raises(ProcessLookupError):
        on_cpu(process.pid)
    assert throttle(signal_to(process), process.pid, 60, lambda: True) == 0


def test_the_throttle_stops_when_told():
    assert throttle(lambda sig: None, os.getpid(), 60, lambda: False) == 0


@pytest.mark.parametrize("process", ["while True: pass"], indirect=True)
def test_the_throttle_of_its_own_is_stopped_when_the_attempt_ends(process):
    ended = iter([False, False, True])
    throttle_in_own_process(process.pid, 60, lambda: next(ended))  # returns after about 0.2 s, not 60
    assert state(process) != "T"
    assert process.poll() is None
