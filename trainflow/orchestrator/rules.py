"""Retry rules by evidence: the spec's `fault_tolerance.rules`, then the built-in ones, matched against
each failing rank's exit code, signal and last lines before the built-in classification decides.

A rule with an outcome replaces the classification (and the attempt is retried as that outcome is);
a rule with an action keeps the built-in outcome and decides the branch itself: stop, retry (within
max_restarts) or exclude the failing node. The rule that matched, and what it matched, are recorded
with the attempt (its evidence and reason: MLflow, the summary)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainflow.backends.base import NodeExit
from trainflow.contracts import AttemptResult, Outcome
from trainflow.contracts.evidence import MatchedRule
from trainflow.orchestrator.failures import (
    NOT_FAILURES,
    Decision,
    RankFailure,
    budget_for,
    rank_failures,
    signal_name,
)
from trainflow.orchestrator.status import AttemptStatus
from trainflow.runspec import FaultTolerance
from trainflow.runspec.retry_rules import BUILT_IN_RULES, RetryRule, RuleAction


@dataclass(frozen=True)
class RuleMatch:
    """The first rule that matched a failing rank, and the evidence it matched."""

    name: str  # "fault_tolerance.rules[0]" or "built-in rule 'out of memory'"
    rule: RetryRule
    failure: RankFailure
    matched: str  # what matched: "exit code 3", "SIGKILL", or the matching line

    def record(self) -> MatchedRule:
        return MatchedRule(
            rule=self.name,
            means=self.rule.describe(),
            matched=self.matched,
            rank=self.failure.rank,
            node=self.failure.node,
            outcome=self.rule.outcome.value if self.rule.outcome else None,
            action=self.rule.action.value if self.rule.action else None,
        )


def ordered_rules(policy: FaultTolerance) -> list[tuple[str, RetryRule]]:
    """The spec's rules in their order, then the built-in ones."""
    return [(f"fault_tolerance.rules[{i}]", rule) for i, rule in enumerate(policy.rules)] + [
        (f"built-in rule '{name}'", rule) for name, rule in BUILT_IN_RULES
    ]


def evidence_lines(failure: RankFailure, exits: list[NodeExit]) -> list[str]:
    """A failure's last lines: its stderr's tail and its error report; a node without rank
    evidence: its own log's tail."""
    lines = list(failure.stderr_tail)
    if failure.error is not None:
        lines.append(f"{failure.error.get('type')}: {failure.error.get('message')}")
    if failure.rank is None:
        lines += [line for e in exits if e.node == failure.node for line in e.log_tail]
    return lines


def matches(rule: RetryRule, failure: RankFailure, lines: list[str]) -> str | None:
    """What of the failure's evidence the rule matched (every matcher it gives must), or None."""
    found = []
    code = failure.exitcode
    if rule.exit_code is not None:
        if code is None or code != rule.exit_code:
            return None
        found.append(f"exit code {code}")
    if rule.signal is not None:
        if code is None or code >= 0 or -code != rule.signal_number:
            return None
        found.append(signal_name(-code))
    if rule.log_pattern is not None:
        pattern = re.compile(rule.log_pattern)
        line = next((line for line in reversed(lines) if pattern.search(line)), None)
        if line is None:
            return None
        found.append(f"line {line.strip()[:300]!r}")
    return ", ".join(found)


def match_rules(policy: FaultTolerance, exits: list[NodeExit], status: AttemptStatus) -> RuleMatch | None:
    """The first rule, in order, that matches the failure the built-in classification takes for
    the cause: the earliest failing rank (failures.rank_failures; ranks that only saw a peer go
    away are left out). What followed from it is never judged: a node whose agent lost the
    rendezvous because the cause's node had gone says nothing of the cause."""
    if not any(e.failing for e in exits):
        return None
    causes = rank_failures(exits, status.errors)
    if not causes:
        return None
    cause = causes[0]
    lines = evidence_lines(cause, exits)
    for name, rule in ordered_rules(policy):
        matched = matches(rule, cause, lines)
        if matched is not None:
            return RuleMatch(name, rule, cause, matched)
    return None


def ruled_outcome(match: RuleMatch, outcome: Outcome, reason: str) -> tuple[Outcome, str]:
    """The outcome and reason once a rule has spoken: its outcome replaces the built-in one."""
    said = f"{match.name} ({match.rule.describe()}) matched {match.failure.who}: {match.matched}"
    if match.rule.outcome is not None:
        return match.rule.outcome, f"{said}; {reason}"
    return outcome, f"{reason}; {said}"


def decide_by_rule(policy: FaultTolerance, results: list[AttemptResult]) -> Decision | None:
    """The branch a rule's action takes after the last attempt; None where no action rule matched it."""
    last = results[-1]
    action = _action(last)
    if last.outcome in (Outcome.SUCCEEDED, Outcome.RESIZED) or action is None:
        return None
    if action == RuleAction.stop.value:
        return Decision(False, f"{last.outcome.value} stopped by rule: {last.reason}")
    if len(results) >= 2 and results[-2].outcome == last.outcome and results[-2].last_step == last.last_step:
        return Decision(
            False, f"crash loop: {last.outcome.value} twice at step {last.last_step}, stopping ({last.reason})"
        )
    used = sum(1 for r in results if _budget(r, policy) == "restart")
    if used > policy.max_restarts:
        return Decision(False, f"restart budget spent ({policy.max_restarts}): {last.outcome.value}: {last.reason}")
    retries = sum(1 for r in results if r.outcome not in NOT_FAILURES)
    backoff = min(policy.backoff_max_s, policy.backoff_s * 2 ** (retries - 2)) if retries > 1 else 0.0
    what = "retry without its node" if action == RuleAction.exclude_node.value else "retry"
    return Decision(
        True, f"{last.outcome.value}: {last.reason}; {what} by rule, restart {used} of {policy.max_restarts}", backoff
    )


def excluded_node(result: AttemptResult) -> int | None:
    """The node a rule's exclude_node action leaves out of the next attempt."""
    rule = result.evidence.rule
    return rule.node if rule is not None and rule.action == RuleAction.exclude_node.value else None


def _action(result: AttemptResult) -> str | None:
    return result.evidence.rule.action if result.evidence.rule is not None else None


def _budget(result: AttemptResult, policy: FaultTolerance) -> str:
    action = _action(result)
    if action in (RuleAction.retry.value, RuleAction.exclude_node.value):
        return "restart"
    return budget_for(result.outcome, policy)[0]
