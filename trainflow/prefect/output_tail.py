"""A sampled, bounded tail of the first node's output (rank 0's prints among it) in the flow run's
logs while an attempt trains: a person in the Prefect UI sees that training is alive and what it
says, without the log store taking every line (the whole output goes to MLflow when the attempt ends)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainflow.backends import AttemptHandle

SAMPLE_EVERY_S = 15.0
LINES_PER_SAMPLE = 5  # the newest lines of each sample
MAX_LINES = 200  # per attempt: a long run's log in Prefect stays small
MAX_LINE_CHARS = 300
READ_AT_MOST = 64 * 1024  # of what a sample finds new: only its end is shown


class OutputTail:
    """Reads what a log file gained since the last sample and logs its newest lines."""

    def __init__(self, path: Path, logger: logging.Logger | logging.LoggerAdapter, attempt: int):
        self.path, self.logger, self.attempt = path, logger, attempt
        self.offset = 0
        self.logged = 0

    def sample(self) -> None:
        if self.logged >= MAX_LINES or not self.path.exists():
            return
        with open(self.path, "rb") as log:
            size = log.seek(0, 2)
            if size <= self.offset:
                return
            log.seek(max(self.offset, size - READ_AT_MOST))
            new = log.read(size - log.tell())
        self.offset = size
        lines = [line[:MAX_LINE_CHARS] for line in new.decode(errors="replace").splitlines() if line.strip()]
        lines = lines[-min(LINES_PER_SAMPLE, MAX_LINES - self.logged) :]
        if lines:
            self.logged += len(lines)
            capped = " (the last lines shown; the whole output goes to MLflow)" if self.logged >= MAX_LINES else ""
            self.logger.info("attempt %d, node 0 output%s:\n%s", self.attempt, capped, "\n".join(lines))


@contextmanager
def sampled_output(handle: AttemptHandle, logger: logging.Logger | logging.LoggerAdapter) -> Iterator[None]:
    """Sample the first node's output every SAMPLE_EVERY_S while the block runs (where this
    machine can read it: local processes; nothing for a remote backend)."""
    path = handle.logs.get(0) if handle.logs else None
    if path is None:
        yield
        return
    tail, stop = OutputTail(path, logger, handle.attempt), threading.Event()

    def sample_until_stopped() -> None:
        while not stop.wait(SAMPLE_EVERY_S):
            try:
                tail.sample()
            except OSError:  # the log went with the node: nothing more to show
                return

    sampler = threading.Thread(target=sample_until_stopped, name="output-tail", daemon=True)
    sampler.start()
    try:
        yield
    finally:
        stop.set()
        sampler.join(2)
