"""The status channel at scale: synthetic ranks against the real orchestrator side.

    trainflow bench scale --ranks 16384 --steps-per-s 1 --json

The orchestrator side (the real StatusServer and AttemptWatcher, with a stand-in launcher whose
nodes all run) is a process of its own, so its CPU figure is its own. The driver (this process)
plays the job: nodes of 8 ranks, each node the real relay code (NodeAggregator fed in-process by
its synthetic ranks) with one real stream (StreamLink) from a loopback address of its own
(127.x.y.z). Every rank steps in lockstep at the given rate; after the measured steps one node
goes silent without exiting (its stream stays open), and the watcher must call it NODE_LOST.

One JSON line: ranks, nodes, steps_per_s, setup_s (until every rank is known), dropped
(connections the orchestrator dropped), gave_up (nodes that never connected), orchestrator_cpu_pct,
threads, rss_mb (the orchestrator's), apply_p50_s / apply_p99_s (a step's end to its row of
metrics at the orchestrator; driver_lag_p99_s is the part of it this driver took to play 8 ranks of
every node and send every node's report, which a real job's relays do each on their own node),
silent_node_detect_s, heartbeat_timeout_s, false_verdicts (any
other verdict), steps_incomplete (steps before the silence that never completed).
"""

from __future__ import annotations

import json
import logging
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from trainflow.contracts.status_protocol import PROTOCOL_VERSION, NodeHello, Progress, StepEntry, encode
from trainflow.relay.aggregator import NodeAggregator
from trainflow.relay.link import StreamLink
from trainflow.relay.relay import REPORT_EVERY_S

RANKS_PER_NODE = 8
HEARTBEAT_INTERVAL_S = 1.0
SETUP_LIMIT_S = 120.0


@dataclass(frozen=True)
class Options:
    ranks: int = 1024
    steps_per_s: float = 1.0
    seconds: float = 20.0  # of steps measured before the silence
    heartbeat_timeout_s: float = 10.0


class BenchError(ValueError):
    """Options the bench cannot run with."""


def run_benchmark(options: Options, log=lambda text: None) -> dict:
    if options.ranks < 2 * RANKS_PER_NODE or options.ranks % RANKS_PER_NODE:
        raise BenchError(f"--ranks: a multiple of {RANKS_PER_NODE} from {2 * RANKS_PER_NODE} ({options.ranks} given)")
    if not 0 < options.steps_per_s <= 100:
        raise BenchError(f"--steps-per-s: more than 0, at most 100 ({options.steps_per_s} given)")
    _raise_open_files()
    side = subprocess.Popen(
        [sys.executable, "-m", "trainflow.drills.bench.scale", "orchestrator", json.dumps(vars_of(options))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        channel = json.loads(side.stdout.readline())
        result = _drive(options, channel, side, log)
        return result
    finally:
        if side.poll() is None:
            side.kill()
        side.wait()


def vars_of(options: Options) -> dict:
    return {name: getattr(options, name) for name in Options.__dataclass_fields__}


def _say(side: subprocess.Popen, *words) -> None:
    try:
        side.stdin.write(" ".join(str(w) for w in words) + "\n")
        side.stdin.flush()
    except BrokenPipeError:
        pass  # the orchestrator side has decided already (a false verdict): its result says which


class _Node:
    def __init__(self, node: int, channel: dict):
        self.node = node
        self.aggregator = NodeAggregator(node, HEARTBEAT_INTERVAL_S)
        self.link = StreamLink(
            channel["address"],
            lambda: NodeHello(token=channel["token"], node=node, attempt=1, version=PROTOCOL_VERSION),
            source_host=f"127.{1 + node // 62500}.{node // 250 % 250}.{node % 250 + 1}",
            read_in_thread=False,
        )
        self.backlog = b""
        self.silent = False
        first = node * RANKS_PER_NODE
        self.ranks = range(first, first + RANKS_PER_NODE)

    def flush(self, now: float) -> None:
        if self.silent:
            return
        report, events = self.aggregator.report(now, everyone=not self.link.connected)
        data = self.backlog + (encode(report) if report is not None else b"") + b"".join(encode(e) for e in events)
        self.backlog = b"" if (not data or self.link.send(data)) else data
        self.link.pump()


def _drive(options: Options, channel: dict, side: subprocess.Popen, log) -> dict:
    nodes = [_Node(n, channel) for n in range(options.ranks // RANKS_PER_NODE)]
    _say(side, "go", time.time())
    now = time.time()
    for node in nodes:  # every rank says hello
        for rank in node.ranks:
            node.aggregator.heard(rank, 10_000 + rank, now)
    period = 1.0 / options.steps_per_s
    steps = max(2, int(options.seconds * options.steps_per_s))
    log(f"scale: {options.ranks} ranks on {len(nodes)} nodes, {steps} steps at {options.steps_per_s:g}/s")
    began = time.monotonic()
    next_flush = began
    next_step = began + 1.0  # a second of heartbeats before the first step
    next_beat = began + HEARTBEAT_INTERVAL_S
    stepped_at = began
    step = 0
    silenced = None
    stepped: list[tuple[int, float]] = []
    lags: list[float] = []
    while True:
        now_m = time.monotonic()
        if step < steps and now_m >= next_step:
            step += 1
            next_step += period
            stepped_at = now_m
            now = time.time()
            stepped.append((step, now))
            # in lockstep every rank but rank 0 reports the same: one message shared (they are frozen)
            first = Progress(
                steps=[
                    StepEntry(
                        step=step,
                        t=now,
                        step_time_s=period,
                        compute_s=period * 0.9,
                        metrics={"loss": 1.0, "step_time_s": period},
                    )
                ],
                t=now,
            )
            other = Progress(
                steps=[StepEntry(step=step, t=now, step_time_s=period, compute_s=period * 0.9, loss=1.0)], t=now
            )
            for node in nodes:
                apply = node.aggregator.apply
                for rank in node.ranks:
                    apply(rank, 10_000 + rank, first if rank == 0 else other, now)
        if now_m >= next_beat:  # ranks between steps heartbeat, as their reporters do when idle
            next_beat = now_m + HEARTBEAT_INTERVAL_S
            if now_m - stepped_at >= HEARTBEAT_INTERVAL_S:
                now = time.time()
                for node in nodes:
                    for rank in node.ranks:
                        node.aggregator.heard(rank, 10_000 + rank, now)
        if now_m >= next_flush:
            next_flush = now_m + REPORT_EVERY_S
            now = time.time()
            for node in nodes:
                node.flush(now)
            sent = time.time()
            lags.extend(sent - t for _, t in stepped)  # a step's end to the last node's report of it
            stepped.clear()
            if step == steps and silenced is None:
                victim = nodes[len(nodes) // 2]
                victim.silent = True  # its stream stays open: silent, not exited
                silenced = time.time()
                _say(side, "silenced", victim.node, silenced, step)
        if silenced is not None:
            break
        time.sleep(max(0.0, min(next_flush, next_beat, next_step if step < steps else next_flush) - time.monotonic()))
    # the nodes go on heartbeating while the orchestrator decides
    done = threading.Event()
    result: dict = {}

    def wait_for_result() -> None:
        result.update(json.loads(side.stdout.readline()))
        done.set()

    threading.Thread(target=wait_for_result, daemon=True).start()
    beat_at = time.monotonic()
    while not done.wait(REPORT_EVERY_S):
        now = time.time()
        for node in nodes:
            if time.monotonic() - beat_at >= HEARTBEAT_INTERVAL_S:
                for rank in node.ranks:
                    node.aggregator.heard(rank, 10_000 + rank, now)
            node.flush(now)
        if time.monotonic() - beat_at >= HEARTBEAT_INTERVAL_S:
            beat_at = time.monotonic()
    result["gave_up"] = sum(1 for node in nodes if node.link.connects == 0)
    lags.sort()
    result["driver_lag_p99_s"] = round(_quantile(lags, 0.99), 3)  # part of apply_p99_s that is the driver's
    result["reconnects"] = sum(max(0, node.link.connects - 1) for node in nodes)
    for node in nodes:
        node.link.close()
    return result


def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---- the orchestrator side, in its own process ---------------------------------------------------------


class _AllRunning:
    """A launcher whose nodes all run: only the status channel can tell the watcher anything."""

    def __init__(self, nodes: int):
        from trainflow.backends.base import NodeExit

        self.exits = [NodeExit(n, None) for n in range(nodes)]

    def poll(self, handle):
        return self.exits

    def probe(self, handle, node):
        return "unknown"


class _Counter(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "dropped a connection" in record.getMessage():
            self.dropped += 1


def _orchestrator_side(options: Options) -> None:
    from trainflow.backends.base import AttemptHandle
    from trainflow.orchestrator.failures import Outcome
    from trainflow.orchestrator.status import StatusServer
    from trainflow.orchestrator.watcher import AttemptWatcher, WatchLimits

    counter = _Counter()
    logging.getLogger("trainflow.orchestrator.status").addHandler(counter)
    nodes = options.ranks // RANKS_PER_NODE
    server = StatusServer()
    server.begin_attempt(1, world_size=options.ranks)
    print(json.dumps({"address": server.address, "token": server.token}), flush=True)
    handle = AttemptHandle(attempt=1, nodes=nodes, started_at=time.time(), logs={})
    watcher = AttemptWatcher(
        _AllRunning(nodes),
        handle,
        server,
        WatchLimits(heartbeat_timeout_s=options.heartbeat_timeout_s, hang_timeout_s=None, startup_timeout_s=600),
        world_size=options.ranks,
        resumed_from_step=0,
        on_metrics=lambda rows: None,
        on_event=lambda event: None,
        step_metrics_every_s=0.0,
    )
    applied: dict[int, float] = {}  # step -> seconds from its end to its row
    metrics = watcher._metrics
    add_step = metrics.add_step

    def timed(report) -> None:
        before = len(metrics._rows)
        add_step(report)
        now = time.time()
        for key, _, step, t in metrics._rows[before:]:
            if key == "loss":
                applied[step] = now - t

    metrics.add_step = timed
    state: dict = {}

    def commands() -> None:
        for line in sys.stdin:
            words = line.split()
            if words[0] == "go":
                state["go"] = float(words[1])
            elif words[0] == "silenced":
                state["silenced"] = (int(words[1]), float(words[2]), int(words[3]))
                state["cpu_until"] = (time.monotonic(), _cpu_s())

    def known() -> None:
        while server.summary().known < options.ranks:
            time.sleep(0.02)
        state["setup_s"] = time.time() - state.get("go", time.time())
        state["cpu_from"] = (time.monotonic(), _cpu_s())

    threading.Thread(target=commands, daemon=True).start()
    threading.Thread(target=known, daemon=True).start()
    verdict = watcher.run()
    threads = threading.active_count()
    node, silenced_at, last_step = state.get("silenced", (None, None, 0))
    expected = (
        verdict.outcome == Outcome.NODE_LOST
        and verdict.evidence.silent_node is not None
        and verdict.evidence.silent_node.node == node
        and silenced_at
    )
    latencies = sorted(applied[s] for s in applied if s <= last_step)
    (t0, c0), (t1, c1) = state.get("cpu_from", (0.0, 0.0)), state.get("cpu_until", (1.0, 0.0))
    print(
        json.dumps(
            {
                "ranks": options.ranks,
                "nodes": nodes,
                "steps_per_s": options.steps_per_s,
                "setup_s": round(state.get("setup_s", float("nan")), 2),
                "dropped": counter.dropped,
                "orchestrator_cpu_pct": round(100 * (c1 - c0) / max(t1 - t0, 1e-9), 1),
                "threads": threads,
                "rss_mb": round(_rss_mb(), 1),
                "apply_p50_s": round(_quantile(latencies, 0.5), 3),
                "apply_p99_s": round(_quantile(latencies, 0.99), 3),
                "silent_node_detect_s": round(verdict.detected_at - silenced_at, 2) if expected else None,
                "heartbeat_timeout_s": options.heartbeat_timeout_s,
                "false_verdicts": 0 if expected else 1,
                "verdict": f"{verdict.outcome.value}: {verdict.reason}"[:300],
                "steps_incomplete": sum(1 for s in range(1, last_step + 1) if s not in applied),
            }
        ),
        flush=True,
    )
    server.close()


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


if __name__ == "__main__":
    if sys.argv[1:2] == ["orchestrator"]:
        _orchestrator_side(Options(**json.loads(sys.argv[2])))
