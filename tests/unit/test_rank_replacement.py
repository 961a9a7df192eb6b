"""Which rank deaths a node's agent replaces in place (backends/rank_replacement.py), and how the
records of the node's ranks tell a replaced rank from a lost one (backends/rank_records.py)."""

from __future__ import annotations

import json
import signal

import pytest

from trainflow.backends import rank_records
from trainflow.backends.rank_replacement import Replacer, outcome_of


@pytest.mark.parametrize(
    "exitcode, outcome",
    [
        (-signal.SIGSEGV, "CRASHED"),
        (-signal.SIGABRT, "CRASHED"),
        (-signal.SIGKILL, "KILLED"),
        (-signal.SIGTERM, None),  # a stop, not a death
        (-signal.SIGINT, None),
        (1, None),  # an exit the script (or a round that was no go) chose
        (0, None),
    ],
)
def test_only_a_death_by_a_signal_is_replaced(exitcode, outcome):
    assert outcome_of(exitcode) == outcome


def test_a_replaced_rank_is_not_an_exit_of_the_node(tmp_path):
    path = tmp_path / "node-0.ranks"
    for entry in (
        {"pid": 10, "local_rank": 0, "rank": 0},
        {"pid": 11, "local_rank": 1, "rank": 1},
        {"replaced": 11, "local_rank": 1, "code": -11},
        {"pid": 12, "local_rank": 1, "rank": 1},
        {"pid": 10, "local_rank": 0, "code": 0},
    ):
        path.open("a").write(json.dumps(entry) + "\n")
    assert rank_records.read_exits(path) == {10: 0}
    assert rank_records.read_replaced(path) == {11}
    assert rank_records.read_ranks(path) == {0: 10, 1: 12}


def test_why_a_death_is_not_replaced(tmp_path):
    replacer = Replacer({"CRASHED": 1}, tmp_path, None)
    (tmp_path / "rank-0").mkdir()
    assert replacer._why_not(0, "CRASHED") == "it died before its first in-memory copy"
    (tmp_path / "rank-0" / "slot-0.json").write_text("{}")
    assert replacer._why_not(0, "CRASHED") is None
    assert replacer._why_not(0, "KILLED") == "KILLED has no recovery in place left in its budget"
    (tmp_path / "rank-0" / "gave-up").touch()
    assert replacer._why_not(0, "CRASHED") == "the round its last replacement joined was no go"


def test_a_rank_the_orchestrator_ended_is_read_with_why_and_whether_for_a_hang(tmp_path):
    path = tmp_path / "node-1.ranks"
    rank_records.note_ended(str(path), 77, "rank 3 on node 1 is frozen while its node is alive", hang=True)
    rank_records.note_ended(str(path), 78, "the drill's corrupt checkpoint", hang=False)
    assert rank_records.read_ended(path) == {
        77: ("rank 3 on node 1 is frozen while its node is alive", True),
        78: ("the drill's corrupt checkpoint", False),
    }
    assert rank_records.read_exits(path) == {}
