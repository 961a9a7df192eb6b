"""What torchrun's agent says about each of its failed ranks, read back from the files it writes.

When a worker fails, the agent prints a failure report (every failed rank with its exit code and
the time it was observed, the first one marked as the root cause) into its node log, and keeps every
local rank's last stderr lines in `DIR/rank-<local rank>.stderr` of its `--log-dir DIR`
(bounded_output.py). Both survive the processes, so they are evidence that does not race.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from trainflow.backends.base import RankExit
from trainflow.backends.bounded_output import rank_stderr_path

REPORT_TAIL_BYTES = 64_000
STDERR_TAIL_BYTES = 16_000
STDERR_TAIL_LINES = 20

_ENTRY = re.compile(
    r"time\s*:\s*(?P<time>\S+)\s*host\s*:\s*\S+\s*rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*"
    r"exitcode\s*:\s*(?P<code>-?\d+)",
)
_ROOT = "Root Cause (first observed failure):"
_ROOT_CAUSE_EXITCODE = re.compile(r"Root Cause.*?exitcode\s*:\s*(-?\d+)", re.S)
# torch's log lines at INFO level (TORCH_CPP_LOG_LEVEL=INFO puts them into every worker's stderr),
# with or without the "[rank3]:" torch puts in front
_CPP_INFO = re.compile(r"^(\[rank\d+\]:)?\[?I\d{4} \d\d:\d\d:\d\d")
# the agent's line on seeing a worker fail: what it logs after it (stopping the other workers,
# leaving a rendezvous whose store a peer took with it) is the agent's shutdown, not the rank's words
_AGENT_SAW_FAILURE = re.compile(r"\] failed \(exitcode: -?\d+\) local_rank: \d+")


def _read_tail(path: Path, size: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - size))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _observed_at(stamp: str) -> float | None:
    try:
        return datetime.strptime(stamp, "%Y-%m-%d_%H:%M:%S").timestamp()
    except ValueError:
        return None


def root_cause_exitcode(node_log: Path) -> int | None:
    """The failed worker's exit code from the agent's last failure report in the node's log."""
    found = _ROOT_CAUSE_EXITCODE.findall(_read_tail(node_log, REPORT_TAIL_BYTES))
    return int(found[-1]) if found else None


def failed_ranks(node_log: Path) -> list[RankExit]:
    """Every rank the node's last failure report lists, the root cause first."""
    text = _read_tail(node_log, REPORT_TAIL_BYTES)
    start = text.rfind("Failures:")
    if start < 0:
        return []
    report = text[start:]
    root_at = report.find(_ROOT)
    exits = []
    for match in _ENTRY.finditer(report):
        exits.append(
            RankExit(
                rank=int(match["rank"]),
                local_rank=int(match["local"]),
                exitcode=int(match["code"]),
                observed_at=_observed_at(match["time"]),
                root_cause=root_at >= 0 and match.start() > root_at,
            )
        )
    return sorted(exits, key=lambda e: not e.root_cause)


def output_before_report(node_log: Path, lines: int = STDERR_TAIL_LINES) -> list[str]:
    """The last lines of a node's log before its agent saw a worker fail, without torch's INFO
    chatter: where the node's ranks write into the log itself (a pod's), their last words."""
    text = _read_tail(node_log, REPORT_TAIL_BYTES)
    start = text.rfind("Failures:")
    if start < 0:
        return []
    header = text.rfind("=" * 20, 0, start)
    before = text[: text.rfind("\n", 0, header) + 1 if header >= 0 else start]
    kept = [line.rstrip() for line in before.splitlines() if line.strip() and not _CPP_INFO.match(line)]
    seen = [i for i, line in enumerate(kept) if _AGENT_SAW_FAILURE.search(line)]
    if seen:
        kept = kept[: seen[-1]]
    return kept[-lines:]


def stderr_tail(log_dir: Path, local_rank: int, lines: int = STDERR_TAIL_LINES) -> list[str]:
    """The last lines a local rank wrote to stderr, without torch's INFO chatter."""
    text = _read_tail(rank_stderr_path(log_dir, local_rank), STDERR_TAIL_BYTES)
    kept = [line.rstrip() for line in text.splitlines() if line.strip() and not _CPP_INFO.match(line)]
    return kept[-lines:]


def log_tail(node_log: Path, lines: int = STDERR_TAIL_LINES) -> list[str]:
    """The last lines of a node's log (its agent's own output), without torch's INFO chatter: the
    evidence of a node that failed before any rank did (a rendezvous that never formed, a port taken)."""
    if not node_log.exists():
        return []
    text = _read_tail(node_log, STDERR_TAIL_BYTES)
    kept = [line.rstrip() for line in text.splitlines() if line.strip() and not _CPP_INFO.match(line)]
    return kept[-lines:]


def error_file_line(log_dir: Path, local_rank: int) -> str:
    """The exception line torchrun's error file holds for a local rank (newest run and attempt):
    written by a script whose entry point is decorated with torch's `@record`; "" without one."""
    files = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/error.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        return ""
    try:
        message = json.loads(_read_tail(files[-1], REPORT_TAIL_BYTES))["message"]
        text = message["message"] if isinstance(message, dict) else str(message)
    except (ValueError, KeyError, TypeError):
        return ""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0][:500] if lines else ""  # torch writes "<type>: <message>"


def failed_ranks_with_evidence(node_log: Path, log_dir: Path) -> tuple[RankExit, ...]:
    """The agent's own account of each failed rank (its node log), with that rank's last stderr lines
    and the line its error file holds (torchrun's `--log-dir`)."""
    return tuple(
        replace(
            failed,
            stderr_tail=tuple(stderr_tail(log_dir, failed.local_rank)),
            error_line=error_file_line(log_dir, failed.local_rank),
        )
        for failed in failed_ranks(node_log)
    )
