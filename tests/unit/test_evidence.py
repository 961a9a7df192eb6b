"""An attempt's evidence is typed where code reads it, and kept as one flat JSON record (MLflow's
evidence.json) whose keys are its parts' names."""

from __future__ import annotations

import json

from trainflow.contracts.evidence import (
    AttemptEvidence,
    FailedRank,
    MatchedRule,
    SilentNode,
    StorageCall,
    Straggler,
)


def test_an_ended_attempts_record_names_the_failed_ranks_and_the_rule_that_matched():
    crashed = FailedRank(1, 1, 3, 12.5, None, ("Traceback ...", "ValueError: bad batch"))
    rule = MatchedRule("fault_tolerance.rules[0]", "exit code 3 -> stop", "exit code 3", 1, 1, None, "stop")
    evidence = AttemptEvidence(
        exit_codes={0: -15, 1: 1},
        finished_ranks=[],
        failed_ranks=[crashed],
        rule=rule,
        stragglers=[Straggler(0, 0, 2.5, 40, 9.0)],
        errors=[{"rank": 1, "type": "ValueError"}],
        logs={0: "logs/node-0.log"},
    )
    record = json.loads(json.dumps(evidence.as_dict()))  # what evidence.json holds
    assert record["exit_codes"] == {"0": -15, "1": 1} and record["finished_ranks"] == []
    assert record["failed_ranks"] == [
        {
            "rank": 1,
            "node": 1,
            "exitcode": 3,
            "at": 12.5,
            "error": None,
            "stderr_tail": ["Traceback ...", "ValueError: bad batch"],
        }
    ]
    assert record["rule"]["action"] == "stop" and record["rule"]["means"] == "exit code 3 -> stop"
    assert record["stragglers"] == [{"kind": "straggler", "rank": 0, "node": 0, "score": 2.5, "step": 40, "t": 9.0}]
    assert not {"stacks", "storage_calls", "preempted", "tracking_store", "node"} & set(record)


def test_a_silent_nodes_fields_and_the_verdicts_details_are_at_the_top_and_stacks_can_be_left_out():
    evidence = AttemptEvidence(
        silent_node=SilentNode(1, 3, "running", 10.4, {3: 10.4, 2: 0.2}),
        stacks={3: "Thread 0x1 (idle)"},
        details={"hang_timeout_s": 30.0},
    )
    record = evidence.as_dict(stacks=False)
    assert record["node"] == 1 and record["rank"] == 3 and record["node_state"] == "running"
    assert record["silent_s"] == 10.4 and record["last_heartbeats"] == {3: 10.4, 2: 0.2}
    assert record["hang_timeout_s"] == 30.0 and "stacks" not in record
    assert evidence.as_dict()["stacks"] == {3: "Thread 0x1 (idle)"}

    plain_node = AttemptEvidence(silent_node=SilentNode(0, None, "gone", 11.0)).as_dict()
    assert plain_node["node"] == 0 and "rank" not in plain_node and "last_heartbeats" not in plain_node


def test_ranks_blocked_in_storage_calls_are_named_with_their_call():
    evidence = AttemptEvidence(storage_calls=[StorageCall(0, 0, "upload step 20", 100.0)])
    assert evidence.as_dict()["storage_calls"] == [{"rank": 0, "node": 0, "call": "upload step 20", "since": 100.0}]
