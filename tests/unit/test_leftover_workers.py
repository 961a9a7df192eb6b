"""What an agent does last (trainflow.backends.leftover_workers): a worker that stops when asked is
given its grace; one that does not, and what it started, is killed; nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

from tests.conftest import ROOT

READY = "open(os.path.join(os.environ['READY_DIR'], str(os.getpid())), 'w').close()"  # its handler is set
IGNORES_SIGTERM = f"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); {READY}; time.sleep(300)"
STOPS_ON_SIGTERM = (
    f"import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); {READY}; time.sleep(300)"
)
STARTS_ONE_AND_IGNORES_SIGTERM = (
    f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {IGNORES_SIGTERM!r}]); {IGNORES_SIGTERM}"
)
PARENT = r"""
import json, os, subprocess, sys, time
import psutil
from trainflow.backends.leftover_workers import end_leftover_workers
polite = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
stubborn = subprocess.Popen([sys.executable, "-c", sys.argv[2]], start_new_session=True)
while len(os.listdir(os.environ["READY_DIR"])) < 3:
    time.sleep(0.1)
pids = [p.pid for p in psutil.Process().children(recursive=True)]
killed = end_leftover_workers(grace_s=1.0)
print(json.dumps({"pids": pids, "polite": polite.pid, "stubborn": stubborn.pid, "killed": killed}))
"""


def test_workers_left_under_an_agent_are_ended_and_only_the_stubborn_killed(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", PARENT, STOPS_ON_SIGTERM, STARTS_ONE_AND_IGNORES_SIGTERM],
        cwd=ROOT,
        env={**os.environ, "READY_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(seen["pids"]) == 3  # the polite worker, the stubborn one and its own child
    assert [_alive(pid) for pid in seen["pids"]] == [False, False, False]
    killed = " ".join(seen["killed"])
    assert len(seen["killed"]) == 2 and f"pid {seen['stubborn']} " in killed
    assert f"pid {seen['polite']} " not in killed


def test_an_agent_with_nothing_left_waits_for_nothing():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; from trainflow.backends.leftover_workers import end_leftover_workers as e\n"
            "t = time.monotonic(); print(e(grace_s=30.0), round(time.monotonic() - t))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.split() == ["[]", "0"], result.stderr[-2000:]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
