"""fault_tolerance.rules: matched against a failing rank's evidence in order, before the built-in
classification and its built-in rules; validated when the spec is read."""

from __future__ import annotations

import signal

import pytest
from pydantic import ValidationError

from trainflow.backends.base import NodeExit, RankExit
from trainflow.contracts.evidence import AttemptEvidence, MatchedRule
from trainflow.orchestrator.failures import AttemptResult, Outcome, decide
from trainflow.orchestrator.rules import decide_by_rule, match_rules, ruled_outcome
from trainflow.orchestrator.status import AttemptStatus
from trainflow.runspec import FaultTolerance


def rank_exit(code: int, *lines: str, rank: int = 1) -> NodeExit:
    failed = RankExit(rank=rank, local_rank=0, exitcode=code, root_cause=True, stderr_tail=tuple(lines))
    return NodeExit(1, 1, ranks=(failed,))


def status() -> AttemptStatus:
    return AttemptStatus(attempt=1, started_at=0.0)


def rules(*items: dict, **more) -> FaultTolerance:
    return FaultTolerance(rules=list(items), **more)


def test_the_first_rule_in_order_that_matches_decides():
    policy = rules(
        {"log_pattern": "never said", "action": "stop"},
        {"exit_code": 3, "outcome": "INFRA"},
        {"exit_code": 3, "action": "stop"},
    )
    match = match_rules(policy, [rank_exit(3, "Traceback (most recent call last):", "SystemExit: 3")], status())
    assert match is not None and match.name == "fault_tolerance.rules[1]" and match.matched == "exit code 3"
    outcome, reason = ruled_outcome(match, Outcome.CRASHED, "rank 1 on node 1 exited with code 3")
    assert outcome == Outcome.INFRA
    assert reason.startswith("fault_tolerance.rules[1] (exit code 3 -> INFRA) matched rank 1 on node 1")


def test_every_matcher_a_rule_gives_must_match():
    policy = rules({"exit_code": 3, "log_pattern": "flaky", "outcome": "INFRA"})
    assert match_rules(policy, [rank_exit(3, "all fine")], status()) is None
    assert match_rules(policy, [rank_exit(4, "flaky link")], status()) is None
    assert match_rules(policy, [rank_exit(3, "flaky link")], status()).matched == "exit code 3, line 'flaky link'"


def test_a_signal_rule_matches_the_signal_that_ended_the_rank():
    policy = rules({"signal": "TERM", "action": "retry"})
    assert match_rules(policy, [rank_exit(-signal.SIGKILL)], status()) is None
    assert match_rules(policy, [rank_exit(-signal.SIGTERM)], status()).matched == "SIGTERM"


def test_built_in_rules_stop_out_of_memory_and_retry_a_taken_port_as_infra():
    oom = match_rules(FaultTolerance(), [rank_exit(1, "torch.OutOfMemoryError: CUDA out of memory.")], status())
    assert oom.name == "built-in rule 'out of memory'" and oom.rule.action.value == "stop"
    # a node whose agent failed before any rank: its own log is the evidence
    node = NodeExit(
        0,
        1,
        log_tail=(
            "torch.distributed.DistNetworkError: The server socket has failed to listen on "
            "any local network address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE",
        ),
    )
    port = match_rules(FaultTolerance(), [node], status())
    assert port.name == "built-in rule 'port already in use'" and port.rule.outcome == Outcome.INFRA
    # the spec's own rules come first
    mine = match_rules(rules({"log_pattern": "EADDRINUSE", "action": "stop"}), [node], status())
    assert mine.name == "fault_tolerance.rules[0]"


def test_only_the_cause_is_judged_never_what_followed_from_it():
    # node 0's ranks fail on a bad argument; node 1's agent then loses the rendezvous node 0 hosted
    cause = NodeExit(
        0,
        1,
        ranks=(
            RankExit(
                rank=0,
                local_rank=0,
                exitcode=2,
                observed_at=10.0,
                root_cause=True,
                stderr_tail=("train.py: error: argument --hidden: invalid int value",),
            ),
        ),
    )
    echo = NodeExit(
        1,
        1,
        log_tail=(
            "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The "
            "connection to the C10d store has failed.",
        ),
    )
    assert match_rules(FaultTolerance(), [cause, echo], status()) is None
    mine = rules({"log_pattern": "invalid int value", "action": "stop"})
    assert match_rules(mine, [cause, echo], status()).failure.rank == 0


def attempt(n: int, outcome: Outcome, rule: dict | None = None, last_step: int = 10) -> AttemptResult:
    matched = (
        MatchedRule(
            **{
                "rule": "fault_tolerance.rules[0]",
                "means": "",
                "matched": "",
                "rank": 1,
                "node": 1,
                "outcome": None,
                "action": None,
                **rule,
            }
        )
        if rule
        else None
    )
    return AttemptResult(
        attempt=n,
        outcome=outcome,
        reason="why",
        world_size=2,
        started_at=0.0,
        ended_at=1.0,
        detected_at=1.0,
        failed_at=None,
        last_step=last_step,
        resumed_from_step=0,
        evidence=AttemptEvidence(rule=matched),
    )


def test_actions_decide_the_branch_and_say_so():
    policy = FaultTolerance(max_restarts=1)
    stop = decide_by_rule(policy, [attempt(1, Outcome.CRASHED, {"action": "stop"})])
    assert stop.retry is False and "stopped by rule" in stop.reason
    # USER_ERROR is not in retry_on, yet the rule retries it, within max_restarts
    retry = {"action": "retry"}
    assert decide(policy, [attempt(1, Outcome.USER_ERROR)]).retry is False
    assert decide_by_rule(policy, [attempt(1, Outcome.USER_ERROR, retry)]).retry is True
    spent = decide_by_rule(policy, [attempt(1, Outcome.USER_ERROR, retry, 5), attempt(2, Outcome.USER_ERROR, retry, 9)])
    assert spent.retry is False and "restart budget spent (1)" in spent.reason
    assert decide_by_rule(policy, [attempt(1, Outcome.CRASHED, {"outcome": "INFRA", "action": None})]) is None


@pytest.mark.parametrize(
    "rule, field",
    [
        ({"log_pattern": "(unclosed", "outcome": "INFRA"}, "log_pattern"),
        ({"signal": "SIGNOPE", "action": "stop"}, "signal"),
        ({"outcome": "INFRA"}, "exit_code, signal or log_pattern"),
        ({"exit_code": 3, "outcome": "INFRA", "action": "stop"}, "either outcome or action"),
        ({"exit_code": 3, "outcome": "SUCCEEDED"}, "not a failure"),
    ],
)
def test_a_rule_that_cannot_work_is_refused_naming_its_field(rule, field):
    with pytest.raises(ValidationError, match=field):
        FaultTolerance(rules=[rule])
