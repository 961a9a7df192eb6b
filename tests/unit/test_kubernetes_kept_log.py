"""What an attempt keeps of a pod's log (kubernetes.objects.kept_log): all of a short one; of a long
one its end, within the byte bound, from a line's start, behind a line saying what was left out."""

from __future__ import annotations

from trainflow.backends.kubernetes.objects import kept_log


def test_a_short_log_is_kept_whole():
    log = "step 1\nstep 2\n"
    assert kept_log(log, tail_lines=5000, max_bytes=2**20) == log


def test_a_log_over_the_byte_bound_keeps_its_last_whole_lines_and_says_so():
    log = "".join(f"line {i} " + "x" * 90 + "\n" for i in range(1000))  # about 100 kB

    kept = kept_log(log, tail_lines=5000, max_bytes=10_000)

    note, *lines = kept.splitlines()
    assert note.startswith("[trainflow: the pod's earlier output is not kept here") and "10000 bytes" in note
    assert len(kept.encode()) <= 10_000 + len(note) + 1
    assert lines[-1].startswith("line 999 ") and all(line.startswith("line ") for line in lines)


def test_a_log_as_long_as_the_lines_asked_for_may_hold_more_and_says_so():
    log = "".join(f"line {i}\n" for i in range(50))

    kept = kept_log(log, tail_lines=50, max_bytes=2**20)

    assert kept.splitlines()[0].startswith("[trainflow:") and kept.endswith(log)
