"""The spec's `fault_tolerance.rules`: what a failure's own evidence (an exit code, a signal, a line
the failing rank wrote) says about it, checked in order before the built-in classification."""

from __future__ import annotations

import re
import signal as signals
from enum import Enum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from trainflow.contracts import RETRYABLE, Outcome
from trainflow.section import Section


class RuleAction(str, Enum):
    retry = "retry"  # retried even if its outcome is not in retry_on, within max_restarts
    stop = "stop"  # the run ends failed, whatever the outcome and the budgets left
    exclude_node = "exclude_node"  # retried without the failing node (replaced where the backend can)


class RetryRule(Section):
    """One rule: what to match (every matcher given must match) and what it means."""

    exit_code: Annotated[int, Field(ge=1, le=255)] | None = Field(
        default=None, title="Exit code", description="The failing rank's (or node's) exit code."
    )
    signal: str | None = Field(
        default=None, title="Signal", description="The signal that ended the failing rank: SIGKILL, KILL or 9."
    )
    log_pattern: str | None = Field(
        default=None,
        title="Log pattern",
        description="A Python regular expression searched in the failing rank's last lines (its stderr's "
        "tail, its error report; a node without rank evidence: its log's tail).",
    )
    outcome: Outcome | None = Field(
        default=None, title="Outcome", description="The attempt's outcome; retried as that outcome is."
    )
    action: RuleAction | None = Field(
        default=None, title="Action", description="retry, stop or exclude_node; the outcome stays the built-in one."
    )

    @field_validator("signal", mode="before")
    @classmethod
    def _signal_name(cls, value: object) -> object:
        if value is None:
            return None
        text = str(value).strip().upper()
        try:
            number = int(text) if text.isdigit() else signals.Signals[text if text.startswith("SIG") else f"SIG{text}"]
            return signals.Signals(number).name
        except (KeyError, ValueError):
            raise ValueError(f"{value!r} is not a signal (e.g. SIGKILL, KILL or 9)") from None

    @field_validator("log_pattern")
    @classmethod
    def _regular_expression(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _complete(self) -> RetryRule:
        if self.exit_code is None and self.signal is None and self.log_pattern is None:
            raise ValueError("a rule needs exit_code, signal or log_pattern")
        if (self.outcome is None) == (self.action is None):
            raise ValueError("a rule needs either outcome or action, not both")
        if self.outcome is not None and self.outcome not in RETRYABLE:
            raise ValueError(f"outcome {self.outcome.value} is not a failure")
        return self

    @property
    def signal_number(self) -> int | None:
        return int(signals.Signals[self.signal]) if self.signal else None

    def describe(self) -> str:
        matchers = [
            f"exit code {self.exit_code}" if self.exit_code is not None else "",
            self.signal or "",
            f"log /{self.log_pattern}/" if self.log_pattern else "",
        ]
        meaning = self.outcome.value if self.outcome else self.action.value if self.action else ""
        return f"{' and '.join(m for m in matchers if m)} -> {meaning}"


# the common cases, checked after the spec's own rules (which can therefore override them)
BUILT_IN_RULES: tuple[tuple[str, RetryRule], ...] = (
    (
        "out of memory",
        RetryRule(
            log_pattern=r"(?i)\bout of memory\b|OutOfMemoryError|\bMemoryError\b|Cannot allocate memory",
            action=RuleAction.stop,
        ),
    ),
    (
        "port already in use",
        RetryRule(log_pattern=r"(?i)address already in use|EADDRINUSE|errno: 98\b", outcome=Outcome.INFRA),
    ),
    (
        "rendezvous failed",
        RetryRule(
            log_pattern=r"RendezvousTimeoutError|RendezvousConnectionError|[Rr]endezvous.{0,80}timed out"
            r"|client socket has timed out after \S+ while trying to connect",
            outcome=Outcome.INFRA,
        ),
    ),
)
