"""A rank whose exit hangs after it has decided to exit ends all the same
(trainflow.runtime.exit_deadline), with its stacks on stderr and exit code 1."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

HANGS_ON_EXIT = r"""
import atexit, time
from trainflow.runtime.exit_deadline import end_within
atexit.register(lambda: time.sleep(300))  # an exit that never ends
end_within(1.0)
raise SystemExit(3)
"""


def test_an_exit_that_hangs_ends_at_the_deadline_with_the_stacks():
    # the exit would take 300 s: within the timeout only if the deadline ended it
    result = subprocess.run(
        [sys.executable, "-c", HANGS_ON_EXIT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Timeout" in result.stderr and "sleep" not in result.stdout, result.stderr[-2000:]


def test_an_exit_that_does_not_hang_keeps_its_own_code():
    quick = HANGS_ON_EXIT.replace("atexit.register(lambda: time.sleep(300))  # an exit that never ends\n", "")
    result = subprocess.run([sys.executable, "-c", quick], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr[-2000:]
