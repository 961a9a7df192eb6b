"""Each rank as its agent records it: its pid and global rank at the start, and the exit code of a
real process once, readable while more ranks are still to exit; a rank started in place of a dead
one is a worker of its node, frozen or not."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from trainflow.backends.base import AttemptHandle
from trainflow.backends.local.observe import node_state
from trainflow.backends.rank_records import RecordedProcess, note_replaced, read_exits, read_ranks, records_path


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


class WarmAgent:
    """A warm node's agent as the launcher holds it: its ranks are the processes its zygote forked."""

    def __init__(self, forked: list[int]):
        self.process = sleeper()
        self.pid, self.forked_workers = self.process.pid, forked

    def poll(self):
        return self.process.poll()


def test_a_frozen_rank_started_in_place_of_a_dead_one_is_seen_on_its_node(tmp_path):
    path = records_path(tmp_path, 0)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    replacement = sleeper()
    agent = WarmAgent([dead.pid])  # the zygote's list: the dead one, not (yet) its replacement
    try:
        with path.open("a") as records:
            records.write(json.dumps({"pid": dead.pid, "local_rank": 0, "rank": 1}) + "\n")
        note_replaced(str(path), dead.pid, 0, -9)
        with path.open("a") as records:
            records.write(json.dumps({"pid": replacement.pid, "local_rank": 0, "rank": 1}) + "\n")
        handle = AttemptHandle(attempt=1, nodes=1, started_at=time.time(), logs={}, rank_records={0: path})
        handle.processes[0] = agent
        assert node_state(handle, 0) == "running"
        replacement.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while node_state(handle, 0) != "workers-stopped" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node_state(handle, 0) == "workers-stopped"  # a frozen rank, not a lost node
    finally:
        for process in (replacement, agent.process):
            process.kill()
            process.wait()


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
