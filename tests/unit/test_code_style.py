"""The code's own claims of style and types hold, as configured in pyproject.toml: ruff (lint,
import order, format) and mypy."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run_tool(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing():
    done = run_tool("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_code_is_as_ruff_formats_it():
    done = run_tool("ruff", "format", "--check", "--no-cache", ".")
    assert done.returncode == 0, f"run `ruff format .`:\n{done.stdout}{done.stderr}"


@pytest.mark.timeout(900)  # a first run reads the types of torch, Prefect and pydantic; later ones use its cache
def test_the_types_are_what_the_code_says():
    done = run_tool("mypy")
    assert done.returncode == 0, done.stdout + done.stderr
