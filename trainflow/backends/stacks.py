"""A process's Python stacks read from outside with py-spy, which works on frozen processes too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PY_SPY = Path(sys.executable).parent / "py-spy"
STACK_LIMIT_CHARS = 20000


def py_spy_dump(pid: int, missing: str = "py-spy is not installed") -> str:
    """The stacks of every thread of `pid`, or a line saying why there are none."""
    if not PY_SPY.exists():
        return missing
    try:
        result = subprocess.run([str(PY_SPY), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "py-spy dump timed out"
    return (result.stdout or result.stderr).strip()[-STACK_LIMIT_CHARS:]
