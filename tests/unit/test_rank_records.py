"""Each rank as its agent records it: its pid and global rank at the start, and the exit code of a
real process once, readable while more ranks are still to exit."""

from __future__ import annotations

import subprocess
import sys

from trainflow.backends.rank_records import RecordedProcess, read_exits, read_ranks, records_path


def test_every_exit_is_recorded_once_with_its_code(tmp_path):
    path = records_path(tmp_path, 1)
    ended = RecordedProcess(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), 0, 2, str(path))
    finished = RecordedProcess(subprocess.Popen([sys.executable, "-c", "pass"]), 1, 3, str(path))
    running = RecordedProcess(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]), 2, 4, str(path))
    try:
        assert read_exits(path) == {}
        assert read_ranks(path) == {2: ended.pid, 3: finished.pid, 4: running.pid}
        assert ended.wait(timeout=60) == 3 and finished.wait(timeout=60) == 0
        assert running.poll() is None
        for _ in range(3):
            ended.poll()
            finished.poll()
        assert read_exits(path) == {ended.pid: 3, finished.pid: 0}
        assert sum('"code"' in line for line in path.read_text().splitlines()) == 2, "each exit is written once"
        running.kill()
        assert running.wait(timeout=60) == -9
        assert read_exits(path)[running.pid] == -9
    finally:
        running.kill()
        running.wait()


def test_a_file_of_another_kind_reads_as_no_exits(tmp_path):
    path = tmp_path / "node-0.ranks"
    path.write_text('not json\n{"pid": 5}\n')
    assert read_exits(path) == {}
