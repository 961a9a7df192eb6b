"""The status channel's messages as the orchestrator accepts them: a JSON object per line, with
the types it relies on. Anything else is dropped (with one log line), never half-applied."""

from __future__ import annotations

import json
from dataclasses import dataclass

HELLO = "hello"
# fields the orchestrator reads, wherever they appear (a message, or an entry of a progress batch)
INTEGER_FIELDS = frozenset({"step", "world_size", "bytes", "files"})
NUMBER_FIELDS = frozenset({
    "t", "step_time_s", "compute_s", "seconds", "loss", "requested_at",
    "stall_s", "stage_s", "save_s", "upload_s", "commit_s",
    "process_started_at", "imported_at", "rendezvous_at",
})
TEXT_FIELDS = frozenset({"kind", "prefix", "params_sha256", "type", "message", "traceback", "status", "reason", "tier"})
REQUIRED = {
    "progress": ("steps",),
    "restored": ("step",),
    "finished": ("step",),
    "resources": ("figures",),
}
IDENTITY_FIELDS = ("rank", "node", "attempt", "pid")


class Malformed(ValueError):
    """A line that is not a message the orchestrator accepts."""


@dataclass(frozen=True)
class Identity:
    """Who a connection said it is in its hello; every later message on it speaks for this."""

    rank: int
    node: int
    attempt: int
    pid: int | None

    def claims_otherwise(self, message: dict) -> str | None:
        """The first identity field a message sets to something else than this, if any."""
        for name in IDENTITY_FIELDS:
            if name in message and message[name] != getattr(self, name):
                return name
        return None

    def stamp(self, message: dict) -> dict:
        return {**message, "rank": self.rank, "node": self.node, "attempt": self.attempt, "pid": self.pid}


def parse_line(line: bytes) -> dict:
    """One message: a JSON object whose known fields have the types the orchestrator relies on."""
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise Malformed("not JSON") from None
    if not isinstance(message, dict):
        raise Malformed(f"a JSON {type(message).__name__}, not an object")
    _check_fields(message)
    if not isinstance(message.get("kind"), str):
        raise Malformed("no kind")
    if not _is_number(message.get("t")) and message["kind"] != HELLO:
        raise Malformed("no time (t)")
    for name in REQUIRED.get(message["kind"], ()):
        if message.get(name) is None:
            raise Malformed(f"a {message['kind']} message without {name}")
    if message["kind"] == "progress":
        steps = message["steps"]
        if not isinstance(steps, list) or not all(isinstance(entry, dict) for entry in steps):
            raise Malformed("progress steps is not a list of objects")
        for entry in steps:
            _check_fields(entry)
            if entry.get("step") is None:
                raise Malformed("a progress entry without step")
            if "metrics" in entry:
                _check_figures(entry["metrics"], "metrics")
    if message["kind"] == "resources":
        _check_figures(message["figures"], "figures")
    return message


def identity_of(hello: dict) -> Identity:
    """The identity a hello claims; it must give rank, node and attempt as integers."""
    for name in ("rank", "node", "attempt"):
        if not _is_integer(hello.get(name)) or hello[name] < 0:
            raise Malformed(f"hello without a valid {name}")
    pid = hello.get("pid")
    if pid is not None and not _is_integer(pid):
        raise Malformed("hello with a pid that is not an integer")
    return Identity(rank=hello["rank"], node=hello["node"], attempt=hello["attempt"], pid=pid)


def _check_fields(message: dict) -> None:
    for name, value in message.items():
        if name in INTEGER_FIELDS and value is not None and not _is_integer(value):
            raise Malformed(f"{name} is not an integer")
        if name in NUMBER_FIELDS and value is not None and not _is_number(value):
            raise Malformed(f"{name} is not a number")
        if name in TEXT_FIELDS and value is not None and not isinstance(value, str):
            raise Malformed(f"{name} is not text")
        if name in IDENTITY_FIELDS and value is not None and not _is_integer(value):
            raise Malformed(f"{name} is not an integer")


def _check_figures(figures: object, name: str) -> None:
    if not isinstance(figures, dict) or not all(
        isinstance(key, str) and (_is_number(value) or value is None) for key, value in figures.items()
    ):
        raise Malformed(f"{name} is not an object of numbers")


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
