"""A node log kept within its bound: the first half as it came, the newest half, and a line saying
how much was dropped between them."""

from __future__ import annotations

import os
from pathlib import Path

from trainflow.backends.bounded_output import BoundedLog, RankTail, _prefixed


def open_log(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # as the launcher opens it


def test_a_log_under_its_bound_is_everything_as_it_came(tmp_path):
    path = tmp_path / "node-0.log"
    log = BoundedLog(open_log(path), 10_000)
    for i in range(100):
        log.write(f"line {i}\n".encode())
        assert path.read_bytes().endswith(f"line {i}\n".encode())  # written as it comes, not at the end
    log.flush()
    assert path.read_text() == "".join(f"line {i}\n" for i in range(100))


def test_a_log_over_its_bound_keeps_its_start_and_end_and_says_what_was_dropped(tmp_path):
    path = tmp_path / "node-0.log"
    log = BoundedLog(open_log(path), 100_000)
    lines = [f"line {i:06d} {'x' * 40}\n".encode() for i in range(20_000)]  # ~1 MB
    for line in lines:
        log.write(line)
        assert path.stat().st_size <= 100_000 + 200
    log.flush()
    text = path.read_bytes()
    assert len(text) <= 100_000 + 200
    assert text.startswith(b"".join(lines[:900]))
    assert text.endswith(b"".join(lines[-900:]))
    note = [line for line in text.split(b"\n") if line.startswith(b"[trainflow: ")]
    assert len(note) == 1 and b"bytes of this node's output dropped here" in note[0]
    dropped = int(note[0].split()[1])
    assert dropped + len(text) - len(note[0]) - 2 == sum(map(len, lines))  # every byte kept or counted


def test_a_ranks_tail_file_holds_its_last_bytes_as_they_come(tmp_path):
    tail = RankTail(tmp_path / "rank-0.stderr")
    for i in range(5000):
        tail.write(f"warning {i}\n".encode())
    tail.write(b"ValueError: the last line\n")
    text = (tmp_path / "rank-0.stderr").read_text()
    assert len(text) <= 16_000 and text.endswith("warning 4999\nValueError: the last line\n")


def test_every_line_of_a_ranks_stderr_gets_its_prefix_across_reads():
    first, at_start = _prefixed(b"one\ntw", b"[default1]:", True)
    second, at_start = _prefixed(b"o\nthree\n", b"[default1]:", at_start)
    assert first + second == b"[default1]:one\n[default1]:two\n[default1]:three\n" and at_start
