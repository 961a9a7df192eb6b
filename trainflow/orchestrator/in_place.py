"""The recoveries in place of an attempt, from what its ranks reported (runtime/in_place.py): one
record per round, with how many rank processes went on, how many were started in place of one that
died, and the slowest rank's phases."""

from __future__ import annotations

from trainflow.contracts import Outcome
from trainflow.contracts.in_place import InPlaceRestart
from trainflow.contracts.status_protocol import RestartedInPlace


def in_place_restarts(rounds: dict[int, list[tuple[int, RestartedInPlace]]]) -> list[InPlaceRestart]:
    restarts = []
    for number, reports in sorted(rounds.items()):
        # every rank names the same cause; a rank that was there throughout knows the copies' cadence
        first = min(reports, key=lambda item: (item[1].replaced, item[0]))[1]
        messages = [message for _, message in reports]
        replaced = {rank for rank, message in reports if message.replaced}
        restarts.append(
            InPlaceRestart(
                round=number,
                outcome=Outcome(first.outcome),
                reason=first.reason,
                cause_rank=first.cause_rank,
                failed_step=first.failed_step,
                restored_step=first.restored_step,
                failed_at=min(m.failed_at for m in messages),
                resumed_at=max(m.t for m in messages),
                ranks_kept=len({rank for rank, _ in reports} - replaced),
                ranks_replaced=len(replaced),
                copy_every_steps=first.copy_every_steps,
                phases={
                    "abort_s": max(m.abort_s for m in messages),
                    "rejoin_s": max(m.rejoin_s for m in messages),
                    "restore_s": max(m.restore_s for m in messages),
                    # a new process's start, to its report to the round (part of rejoin_s)
                    **({"replace_s": max(m.replace_s for m in messages)} if replaced else {}),
                },
            )
        )
    return restarts
