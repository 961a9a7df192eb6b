"""In-process restart's round at scale: N ranks report to the job's store and rank 0 decides for all
(trainflow/runtime/in_place.py), against a real c10d TCPStore on loopback. Synthetic ranks write
their reports and read the decision from a pool of client connections; rank 0's side is the
runtime's own `decide_for_all`.

    python bench/in_place_round.py --ranks 1024,4096,16384 [--json]

Per N: how long the N reports take to reach the store (in a real job N processes write one each
at once; here a pool of CLIENTS connections writes them all), rank 0's decision once they are in
(one wait and one multi-get of N values, then the rules), and the N reads of the decision.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore

from trainflow.backends.ports import free_port
from trainflow.runtime.in_place import ROUND_KEY, decide_for_all
from trainflow.runtime.in_place_rules import Report

CLIENTS = 32
PEER_GONE = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20623"
WAIT = timedelta(seconds=300)


def report_of(rank: int) -> str:
    cause = rank == 1
    report = Report(
        rank=rank,
        type="DistNetworkError" if cause else "RuntimeError",
        message="link down" if cause else PEER_GONE,
        step=12 if cause else 13,
        copies=[10, 11] if cause else [11, 12],
        t=time.time(),
    )
    return json.dumps(report.as_dict())


def in_pool(ranks: int, port: int, work) -> float:
    """Run `work(client, rank)` for every rank from CLIENTS connections; the seconds it took."""

    def share(first: int) -> None:
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=WAIT)
        for rank in range(first, ranks, CLIENTS):
            work(client, rank)

    threads = [threading.Thread(target=share, args=(i,)) for i in range(CLIENTS)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def measure(ranks: int) -> dict:
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=WAIT)
    key = f"{ROUND_KEY}/1"
    reports_s = in_pool(ranks, port, lambda client, rank: client.set(f"{key}/report/{rank}", report_of(rank)))
    began = time.perf_counter()
    decision = decide_for_all(server, key, ranks, {"INFRA": 3}, [], WAIT)
    decide_s = time.perf_counter() - began
    server.set(f"{key}/decision", json.dumps(decision.as_dict()))
    read_s = in_pool(ranks, port, lambda client, rank: client.get(f"{key}/decision"))
    assert decision.go and decision.cause_rank == 1 and decision.restored_step == 11, decision
    return {
        "ranks": ranks,
        "reports_in_s": round(reports_s, 3),
        "rank0_decide_s": round(decide_s, 4),
        "decision_read_s": round(read_s, 3),
        "store_requests": 2 * ranks + 2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,4096,16384")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(int(n)) for n in args.ranks.split(",")]
    if args.json:
        print(json.dumps(rows))
        return
    for row in rows:
        print(
            f"{row['ranks']:>6} ranks: reports in {row['reports_in_s']:.3f} s ({CLIENTS} connections), rank 0 "
            f"decides in {row['rank0_decide_s'] * 1e3:.1f} ms, decision read by all in {row['decision_read_s']:.3f} s"
        )


if __name__ == "__main__":
    main()
