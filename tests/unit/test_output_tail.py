"""The flow run's logs get a sampled, bounded tail of the first node's output while it trains."""

from __future__ import annotations

import logging

from trainflow.prefect import output_tail
from trainflow.prefect.output_tail import OutputTail


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_each_sample_shows_the_newest_lines_and_the_whole_tail_is_bounded(tmp_path, monkeypatch):
    logger, seen = logging.getLogger("output-tail-test"), Lines()
    logger.addHandler(seen)
    logger.setLevel(logging.INFO)
    log = tmp_path / "node-0.log"
    tail = OutputTail(log, logger, attempt=2)
    tail.sample()  # no output yet: nothing
    log.write_text("".join(f"step {n} loss 0.5\n" for n in range(1, 11)))
    tail.sample()
    assert seen.messages == ["attempt 2, node 0 output:\n" + "\n".join(f"step {n} loss 0.5" for n in range(6, 11))]
    tail.sample()  # nothing new: nothing logged
    assert len(seen.messages) == 1
    monkeypatch.setattr(output_tail, "MAX_LINES", 7)
    with open(log, "a") as out:
        out.write("step 11\nstep 12\nstep 13\n")
    tail.sample()
    assert seen.messages[-1].endswith("step 12\nstep 13") and "the last lines shown" in seen.messages[-1]
    with open(log, "a") as out:
        out.write("step 14\n")
    tail.sample()
    assert len(seen.messages) == 2  # the bound is reached
