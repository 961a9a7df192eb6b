"""In-process restart's round at scale: N ranks report to the job's store and rank 0 decides for all
(trainflow/runtime/in_place.py), against a real c10d TCPStore on loopback. Synthetic ranks write
their reports and read the decision from a pool of client connections; rank 0's side is the
runtime's own `decide_for_all`.

    python bench/in_place_round.py --ranks 1024,4096,16384 [--json]

Per N: how long the N reports take to reach the store (in a real job N processes write one each
at once; here a pool of CLIENTS connections writes them all), rank 0's decision once they are in
(one wait for the key the last rank to arrive sets, then the causes and the copy counts: a constant
number of requests), and the N reads of the decision.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore

from trainflow.backends.ports import free_port
from trainflow.runtime.in_place import ROUND_KEY, decide_for_all, report_to_round
from trainflow.runtime.in_place_rules import Report

CLIENTS = 32
PEER_GONE = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20623"
WAIT = timedelta(seconds=300)


def report_of(rank: int) -> Report:
    cause = rank == 1
    return Report(
        rank=rank,
        type="DistNetworkError" if cause else "RuntimeError",
        message="link down" if cause else PEER_GONE,
        step=12 if cause else 13,
        copies=[10, 11] if cause else [11, 12],
        t=time.time(),
    )


def connections(port: int) -> list[TCPStore]:
    return [TCPStore("127.0.0.1", port, is_master=False, timeout=WAIT) for _ in range(CLIENTS)]


def in_pool(ranks: int, clients: list[TCPStore], work) -> float:
    """Run `work(client, rank)` for every rank from the pool's connections; the seconds it took."""

    def share(first: int) -> None:
        for rank in range(first, ranks, CLIENTS):
            work(clients[first], rank)

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
    clients = connections(port)  # a real job's ranks are connected to the store long before a failure
    reports_s = in_pool(ranks, clients, lambda client, rank: report_to_round(client, key, report_of(rank), ranks))
    began = time.perf_counter()
    decision = decide_for_all(
        server, key, ranks, report_of(0).copies, {"INFRA": 3}, [], lambda names: server.wait(names, WAIT)
    )
    decide_s = time.perf_counter() - began
    server.set(f"{key}/decision", json.dumps(decision.as_dict()))
    read_s = in_pool(ranks, clients, lambda client, rank: client.get(f"{key}/decision"))
    assert decision.go and decision.cause_rank == 1 and decision.restored_step == 11, decision
    return {
        "ranks": ranks,
        "reports_in_s": round(reports_s, 3),
        "rank0_decide_s": round(decide_s, 4),
        "decision_read_s": round(read_s, 3),
        "store_requests": 7 * ranks + 7,
    }


def in_place_round(sizes: tuple[int, ...] = (1024, 4096, 16384)) -> dict:
    """The `in_place_round` part of `make bench`."""
    return {"clients": CLIENTS, "runs": [measure(n) for n in sizes]}


def markdown(result: dict) -> list[str]:
    lines = [
        "## In-process restart's round at scale",
        "",
        f"`python bench/in_place_round.py` (measured {result.get('measured_at', '–')}): N ranks report to a real c10d "
        f"TCPStore on loopback, written here by a pool of {result['clients']} client connections; rank 0 runs the "
        "runtime's own `report_to_round` and `decide_for_all`. Each rank makes at most 7 store requests (a count "
        "for each of its two copies, a symptom count or its cause, its arrival and the arrivals' count, the "
        "decision read); the last rank to arrive sets one key, which rank 0 waits for, then it reads only the "
        "causes and two counts. The store serves about 7N requests a round; no rank's part grows with N.",
        "",
        "| ranks | reports in (s) | rank 0 decides (ms) | decision read by all (s) | store requests |",
        "|---|---|---|---|---|",
    ]
    for row in result["runs"]:
        lines.append(
            f"| {row['ranks']} | {row['reports_in_s']:.3f} | {row['rank0_decide_s'] * 1e3:.1f} | "
            f"{row['decision_read_s']:.3f} | {row['store_requests']} |"
        )
    return [*lines, ""]


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
