"""The watcher against a real status channel and a stand-in launcher: hangs (heartbeats without
progress), lost nodes (silence), frozen workers (ended for a replacement in place, where the budget
allows), stragglers, and exits."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from trainflow.backends.base import AttemptHandle, NodeExit, RankExit
from trainflow.contracts.status_protocol import (
    PROTOCOL_VERSION,
    Checkpoint,
    Error,
    Finished,
    NodeHello,
    Progress,
    RestartedInPlace,
    StepEntry,
    Storage,
    encode,
)
from trainflow.orchestrator.failures import Outcome
from trainflow.orchestrator.status import StatusServer
from trainflow.orchestrator.stragglers import Straggler
from trainflow.orchestrator.watcher import AttemptWatcher, WatchLimits
from trainflow.relay.relay import NodeRelay
from trainflow.runtime.reporter import StatusReporter


class StandInLauncher:
    """Nodes that keep running unless told otherwise; `probe` answers what the test says."""

    def __init__(self, nodes: int, state: str = "running"):
        self.exits = [NodeExit(n, None) for n in range(nodes)]
        self.state = state
        self.stacks_asked = False

    def poll(self, handle):
        return list(self.exits)

    def probe(self, handle, node):
        return self.state

    def dump_stacks(self, handle, pids):
        self.stacks_asked = True
        return {rank: f"stack of {pid}" for rank, pid in pids.items()}


@pytest.fixture
def channel():
    server = StatusServer()
    server.begin_attempt(1, world_size=2)
    yield server
    server.close()


def reporter(channel, rank: int, interval: float = 0.05, pid: int | None = None) -> StatusReporter:
    """Rank `rank` on node `rank`, as process 100 + rank; with `pid`, a process started in its place."""
    identity = {"rank": rank, "node": rank, "attempt": 1, "pid": 100 + rank}
    if pid is not None:
        identity.update(pid=pid, replaces=[100 + rank])
    return StatusReporter(
        channel.address, channel.token, identity, heartbeat_interval_s=interval, orchestrator_timeout_s=30
    )


def watcher(channel, launcher, **limits) -> AttemptWatcher:
    handle = AttemptHandle(attempt=1, nodes=2, started_at=time.time(), logs={})
    return AttemptWatcher(
        launcher,
        handle,
        channel,
        WatchLimits(**limits),
        world_size=2,
        resumed_from_step=0,
        on_metrics=lambda rows: None,
        on_event=lambda event: None,
    )


def test_heartbeats_without_progress_are_a_hang_with_stacks(channel):
    ranks = [reporter(channel, r) for r in range(2)]
    try:
        for r in ranks:
            r.send(Progress(steps=[StepEntry(step=5, step_time_s=0.01, compute_s=0.01)]))
        launcher = StandInLauncher(2)
        started = time.monotonic()
        result = watcher(channel, launcher, heartbeat_timeout_s=5, hang_timeout_s=1.0).run(poll_s=0.05)
        assert result.outcome == Outcome.HUNG
        assert 0.9 < time.monotonic() - started < 3.0  # the hang timeout, plus a poll or two
        assert "no step progress" in result.reason
        assert launcher.stacks_asked and result.evidence.stacks == {0: "stack of 100", 1: "stack of 101"}
    finally:
        for r in ranks:
            r.close()


def test_silence_without_exit_is_a_lost_node(channel):
    alive, doomed = reporter(channel, 0), reporter(channel, 1)
    try:
        for r in (alive, doomed):
            r.send(Progress(steps=[StepEntry(step=3, step_time_s=0.01)]))
        time.sleep(0.2)
        doomed.close()  # node 1 goes quiet, its process "still running"
        result = watcher(channel, StandInLauncher(2), heartbeat_timeout_s=0.6, hang_timeout_s=30).run(poll_s=0.05)
        assert result.outcome == Outcome.NODE_LOST
        assert result.evidence.silent_node.node == 1 and result.detection_latency_s < 0.6 + 0.5
    finally:
        alive.close()


def test_a_reader_starved_of_the_cpu_is_no_silence_of_the_workers(channel, monkeypatch):
    """On a loaded machine the channel's reader may not run for longer than the heartbeat timeout
    while the workers' heartbeats wait in its sockets: that is no lost node."""
    ranks = [reporter(channel, r) for r in range(2)]
    loop, starved = channel._loop, threading.Event()
    select = loop._selector.select

    def starved_select(timeout):
        starved.wait()  # the reader thread gets no turn
        return select(timeout)

    try:
        for r in ranks:
            r.send(Progress(steps=[StepEntry(step=3, step_time_s=0.01)]))
        deadline = time.monotonic() + 10
        while channel.summary().known < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        judge = watcher(channel, StandInLauncher(2), heartbeat_timeout_s=0.6, hang_timeout_s=30)
        monkeypatch.setattr(loop._selector, "select", starved_select)
        time.sleep(1.5)  # the heartbeats keep coming; nobody reads them
        assert channel.summary().silent_since < time.time() - 1.2  # as the channel last saw them
        assert judge._check() is None
        starved.set()
        time.sleep(0.5)
        assert judge._check() is None  # read at last: both ranks alive all along
        for r in ranks:
            r.close()  # now they fall silent for real
        time.sleep(1.0)
        result = judge._check()
        assert result is not None and result.outcome == Outcome.NODE_LOST, result
    finally:
        starved.set()
        for r in ranks:
            r.close()


def test_a_frozen_worker_on_a_live_node_is_a_hang(channel):
    alive, frozen = reporter(channel, 0), reporter(channel, 1)
    try:
        for r in (alive, frozen):
            r.send(Progress(steps=[StepEntry(step=3, step_time_s=0.01)]))
        time.sleep(0.2)
        frozen.close()
        result = watcher(
            channel, StandInLauncher(2, state="workers-stopped"), heartbeat_timeout_s=0.6, hang_timeout_s=30
        ).run(poll_s=0.05)
        assert result.outcome == Outcome.HUNG and "frozen" in result.reason
    finally:
        alive.close()


class EndingLauncher(StandInLauncher):
    """A frozen rank's node whose agent replaces the ended rank (`replaced`), or fails without."""

    def __init__(self, replaced: bool):
        super().__init__(2, state="workers-stopped")
        self.replaced, self.ended = replaced, []

    def end_rank(self, handle, node, pid, reason, hang):
        self.ended.append((node, pid, reason))
        self.state = "running"
        if not self.replaced:  # the agent stops its node, torchrun reporting a rank killed
            self.exits[node] = NodeExit(node, 1)
        return True


def frozen_rank_watch(channel, launcher: EndingLauncher, on_ended) -> AttemptWatcher:
    watch = watcher(channel, launcher, heartbeat_timeout_s=0.6, hang_timeout_s=1.5, startup_timeout_s=20)
    watch.handle.in_place_budget = {"HUNG": 1}
    ending = launcher.end_rank

    def end(handle, node, pid, reason, hang):
        assert hang  # to be replaced in place, its death the hang
        found = ending(handle, node, pid, reason, hang)
        on_ended()
        return found

    launcher.end_rank = end
    return watch


def test_a_frozen_rank_is_ended_for_its_replacement_in_place_and_the_attempt_goes_on(channel):
    alive, frozen = reporter(channel, 0), reporter(channel, 1)
    launcher, replacement = EndingLauncher(replaced=True), None

    def rejoin():
        # the peer's report of the round reaches the orchestrator first; the new process is heard
        # only after longer than the heartbeat timeout: its rank is not silent, it is being replaced
        nonlocal replacement
        alive.send(round_report(replaced=False))
        wait_until(lambda: channel.snapshot().in_place)
        time.sleep(1.0)
        replacement = reporter(channel, 1, pid=555)
        replacement.send(round_report(replaced=True))
        time.sleep(0.8)  # the steps since come in late: the ranks stalled from the freeze to here
        for r in (alive, replacement):
            r.send(Progress(steps=[StepEntry(step=4, step_time_s=0.01)]))
            r.send(Finished(step=4, loss=0.5, params_sha256="a" * 64))
            r.close()
        launcher.exits = [NodeExit(n, 0) for n in range(2)]  # and the job is done

    rejoining = threading.Thread(target=rejoin)
    try:
        for r in (alive, frozen):
            r.send(Progress(steps=[StepEntry(step=3, step_time_s=0.01)]))
        time.sleep(0.2)
        frozen.close()
        result = frozen_rank_watch(channel, launcher, rejoining.start).run(poll_s=0.05)
        rejoining.join(timeout=30)
        assert [(node, pid) for node, pid, _ in launcher.ended] == [(1, 101)]
        assert "rank 1 on node 1 is frozen" in launcher.ended[0][2]
        assert result.outcome == Outcome.SUCCEEDED, result.reason
        (restart,) = result.in_place
        assert (restart.outcome, restart.ranks_kept, restart.ranks_replaced) == (Outcome.HUNG, 1, 1)
    finally:
        for r in (alive, replacement):
            if r is not None:
                r.close()


def test_a_dead_rank_being_replaced_is_not_a_lost_node_while_its_new_process_starts(channel):
    class Replacing(StandInLauncher):  # rank 1's process (101) died; its agent started another
        def replaced_pids(self, handle, node):
            return {101} if node == 1 else set()

    alive, dead = reporter(channel, 0), reporter(channel, 1)
    launcher = Replacing(2)

    def start_late():  # slower to say hello than the heartbeat timeout (a cold start, a busy host)
        time.sleep(1.5)
        replacement = reporter(channel, 1, pid=555)
        for r in (alive, replacement):
            r.send(Progress(steps=[StepEntry(step=4, step_time_s=0.01)]))
            r.send(Finished(step=4, loss=0.5, params_sha256="a" * 64))
            r.close()
        launcher.exits = [NodeExit(n, 0) for n in range(2)]

    for r in (alive, dead):
        r.send(Progress(steps=[StepEntry(step=3, step_time_s=0.01)]))
    time.sleep(0.2)
    dead.close()
    starting = threading.Thread(target=start_late)
    starting.start()
    try:
        watch = watcher(channel, launcher, heartbeat_timeout_s=0.6, hang_timeout_s=30, startup_timeout_s=20)
        watch.handle.in_place_budget = {"CRASHED": 1}
        result = watch.run(poll_s=0.05)
        assert result.outcome == Outcome.SUCCEEDED, result.reason
    finally:
        starting.join(timeout=30)
        alive.close()


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


def test_a_frozen_rank_ended_but_not_replaced_is_the_hang_it_was_not_a_kill(channel):
    alive, frozen = reporter(channel, 0), reporter(channel, 1)
    try:
        for r in (alive, frozen):
            r.send(Progress(steps=[StepEntry(step=3, step_time_s=0.01)]))
        time.sleep(0.2)
        frozen.close()
        launcher = EndingLauncher(replaced=False)
        result = frozen_rank_watch(channel, launcher, lambda: None).run(poll_s=0.05)
        assert len(launcher.ended) == 1
        assert result.outcome == Outcome.HUNG and "rank 1 on node 1 is frozen" in result.reason
    finally:
        alive.close()


def round_report(replaced: bool) -> RestartedInPlace:
    return RestartedInPlace(
        round=1,
        outcome="HUNG",
        reason="rank 1 was ended frozen (rank 1 on node 1 is frozen while its node is alive; process 101) in step 4",
        cause_rank=1,
        failed_step=4,
        restored_step=3,
        failed_at=time.time(),
        abort_s=0.0,
        rejoin_s=0.1,
        restore_s=0.001,
        replaced=replaced,
    )


def test_a_slow_rank_is_reported_as_a_straggler_and_training_goes_on(channel):
    events = []
    ranks = [reporter(channel, r) for r in range(2)]
    launcher = StandInLauncher(2)
    handle = AttemptHandle(attempt=1, nodes=2, started_at=time.time(), logs={})
    watch = AttemptWatcher(
        launcher,
        handle,
        channel,
        WatchLimits(heartbeat_timeout_s=5, hang_timeout_s=30, straggler_factor=1.5, straggler_steps=3),
        2,
        0,
        lambda rows: None,
        events.append,
    )
    try:
        for step in range(1, 41):
            ranks[0].send(Progress(steps=[StepEntry(step=step, step_time_s=0.03, compute_s=0.01)]))
            ranks[1].send(Progress(steps=[StepEntry(step=step, step_time_s=0.03, compute_s=0.03)]))
        time.sleep(0.5)
        for _ in range(5):
            assert watch._check() is None  # not fatal
        stragglers = [e for e in events if isinstance(e, Straggler)]
        assert [(e.rank, e.node) for e in stragglers] == [(1, 1)]
        assert stragglers[0].score == pytest.approx(3.0, rel=0.01)
    finally:
        for r in ranks:
            r.close()


def test_an_exit_ends_the_watch_at_once(channel):
    trained = reporter(channel, 1)
    trained.send(Progress(steps=[StepEntry(step=3, step_time_s=0.01)]))
    trained.close()
    deadline = time.monotonic() + 30
    while channel.snapshot().first_step_at is None and time.monotonic() < deadline:
        time.sleep(0.02)
    launcher = StandInLauncher(2)
    launcher.exits = [NodeExit(0, None), NodeExit(1, 3)]
    result = watcher(channel, launcher, heartbeat_timeout_s=5, hang_timeout_s=30).run(poll_s=0.05)
    assert result.outcome == Outcome.CRASHED and "code 3" in result.reason


def test_a_stall_while_ranks_wait_on_the_checkpoint_store_is_infra_not_a_hang(channel):
    ranks = [reporter(channel, r) for r in range(2)]
    try:
        # sent before the last progress, on the same connections: known to the watcher when it stalls
        ranks[0].send(
            Checkpoint(
                step=4,
                prefix="run/step-00000004",
                status="failed",
                reason="upload failed: rank 0: ReadTimeoutError",
                bytes=0,
                stall_s=0.0,
            )
        )
        for r in ranks:
            r.send(Storage(state="waiting", since=time.time(), call="waiting for the checkpoint save of step 5"))
            r.send(Progress(steps=[StepEntry(step=5, step_time_s=0.01, compute_s=0.01)]))
        launcher = StandInLauncher(2)
        result = watcher(channel, launcher, heartbeat_timeout_s=5, hang_timeout_s=1.0).run(poll_s=0.05)
        assert result.outcome == Outcome.INFRA
        assert "blocked in storage calls" in result.reason and "checkpoint save of step 5" in result.reason
        assert "last storage error: upload failed: rank 0: ReadTimeoutError" in result.reason
        assert sorted(c.rank for c in result.evidence.storage_calls) == [0, 1]
        assert not launcher.stacks_asked
    finally:
        for r in ranks:
            r.close()


def test_a_stall_with_a_rank_stuck_outside_storage_calls_is_a_hang(channel):
    ranks = [reporter(channel, r) for r in range(2)]
    try:
        ranks[0].send(Storage(state="waiting", since=time.time(), call="waiting for the checkpoint save of step 5"))
        for r in ranks:
            r.send(Progress(steps=[StepEntry(step=5, step_time_s=0.01, compute_s=0.01)]))
        result = watcher(channel, StandInLauncher(2), heartbeat_timeout_s=5, hang_timeout_s=1.0).run(poll_s=0.05)
        assert result.outcome == Outcome.HUNG
    finally:
        for r in ranks:
            r.close()


def test_a_stall_after_the_storage_call_returned_is_still_a_hang(channel):
    ranks = [reporter(channel, r) for r in range(2)]
    try:
        for r in ranks:
            r.send(Storage(state="waiting", since=time.time(), call="waiting for the checkpoint save of step 5"))
            r.send(Storage(state="done", since=time.time(), call="waiting for the checkpoint save of step 5"))
            r.send(Progress(steps=[StepEntry(step=5, step_time_s=0.01, compute_s=0.01)]))
        result = watcher(channel, StandInLauncher(2), heartbeat_timeout_s=5, hang_timeout_s=1.0).run(poll_s=0.05)
        assert result.outcome == Outcome.HUNG
    finally:
        for r in ranks:
            r.close()


class LingeringAgentLauncher(StandInLauncher):
    """Node 1 exited 0; node 0's worker is gone but its agent (host of the rendezvous store) stays
    for `polls` more polls, longer than the watcher ever waited before, then exits 0."""

    def __init__(self, polls: int):
        super().__init__(2)
        self.polls = polls

    def poll(self, handle):
        self.polls -= 1
        if self.polls > 0:
            return [NodeExit(0, None, workers_lost=True), NodeExit(1, 0)]
        return [NodeExit(0, 0), NodeExit(1, 0)]


def test_a_lingering_agent_does_not_turn_a_finished_attempt_into_a_crash(channel):
    ranks = [reporter(channel, r) for r in range(2)]
    for r in ranks:
        r.send(Progress(steps=[StepEntry(step=200, step_time_s=0.01)]))
    ranks[0].send(Finished(step=200, params_sha256="ab" * 32, loss=0.1))
    ranks[1].send(Finished(step=200))
    for r in ranks:
        r.close()
    deadline = time.monotonic() + 30
    while len(channel.snapshot().finished_ranks) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    launcher = LingeringAgentLauncher(polls=80)  # 80 polls of 0.05 s: past the 3 s the watcher used to allow
    result = watcher(channel, launcher, heartbeat_timeout_s=30, hang_timeout_s=30).run(poll_s=0.05)
    assert launcher.polls <= 0  # it waited for the agent's own exit code
    assert result.outcome == Outcome.SUCCEEDED, result.reason
    assert result.evidence.finished_ranks == [0, 1]


def test_a_script_that_never_reports_is_a_hang_at_start_up_not_infra(channel):
    launcher = StandInLauncher(2)
    result = watcher(channel, launcher, heartbeat_timeout_s=5, hang_timeout_s=30, startup_timeout_s=0.3).run(
        poll_s=0.05
    )
    assert result.outcome == Outcome.HUNG
    assert "fault_tolerance.startup_timeout_s" in result.reason
    assert "nodes_seen" not in result.evidence.details  # this backend cannot say more


def test_a_rank_that_never_reports_is_named_after_the_start_up_limit_not_lost(channel):
    present = reporter(channel, 0)  # rank 1 never says a word
    try:
        present.send(Progress(steps=[StepEntry(step=1, step_time_s=0.01)]))
        result = watcher(
            channel, StandInLauncher(2), heartbeat_timeout_s=30, hang_timeout_s=60, startup_timeout_s=1.0
        ).run(poll_s=0.05)
    finally:
        present.close()
    assert result.outcome == Outcome.HUNG and "ranks 1 never reported" in result.reason
    assert result.evidence.details["never_reported"] == [1]


def test_a_start_up_timeout_carries_what_the_backend_sees_of_each_node(channel):
    class Describing(StandInLauncher):
        def describe(self, handle):
            return {"waiting": {0: "ImagePullBackOff"}, "nodes": {0: "", 1: ""}}

    result = watcher(channel, Describing(2), heartbeat_timeout_s=5, hang_timeout_s=30, startup_timeout_s=0.3).run(
        poll_s=0.05
    )
    assert result.outcome == Outcome.HUNG
    assert result.evidence.details["nodes_seen"]["waiting"] == {0: "ImagePullBackOff"}


def test_a_plain_script_is_watched_by_its_exits_only(channel):
    class Exiting(StandInLauncher):
        def __init__(self):
            super().__init__(2)
            self.polls = 0

        def poll(self, handle):
            self.polls += 1
            return [NodeExit(0, 0), NodeExit(1, 0)] if self.polls > 20 else [NodeExit(0, None), NodeExit(1, None)]

    handle = AttemptHandle(attempt=1, nodes=2, started_at=time.time() - 3600, logs={})  # "started" an hour ago
    watch = AttemptWatcher(
        Exiting(),
        handle,
        channel,
        WatchLimits(heartbeat_timeout_s=1, hang_timeout_s=1, startup_timeout_s=1),
        2,
        0,
        lambda rows: None,
        lambda event: None,
        plain=True,
    )
    result = watch.run(poll_s=0.01)
    assert result.outcome == Outcome.SUCCEEDED  # no report ever came, and none was needed


def test_ranks_that_finished_are_not_lost_while_their_processes_take_time_to_exit(channel):
    ranks = [reporter(channel, r) for r in range(2)]
    for r in ranks:
        r.send(Progress(steps=[StepEntry(step=60, step_time_s=0.01)]))
    ranks[0].send(Finished(step=60, params_sha256="ab" * 32, loss=0.1))
    ranks[1].send(Finished(step=60))
    for r in ranks:
        r.close()  # heartbeats stop here, as in run.finish()
    deadline = time.monotonic() + 30
    while len(channel.snapshot().finished_ranks) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)

    class SlowToExit(StandInLauncher):
        """Still running for 40 polls of 0.05 s, four times the heartbeat timeout, then exit 0."""

        def __init__(self):
            super().__init__(2)
            self.polls = 40

        def poll(self, handle):
            self.polls -= 1
            return [NodeExit(n, None if self.polls > 0 else 0) for n in range(2)]

    launcher = SlowToExit()
    result = watcher(channel, launcher, heartbeat_timeout_s=0.5, hang_timeout_s=0.5).run(poll_s=0.05)
    assert launcher.polls <= 0
    assert result.outcome == Outcome.SUCCEEDED, result.reason


def test_a_slow_start_up_is_no_hang_when_one_rank_reports_its_first_step_before_the_other(channel):
    channel._attempt.started_at -= 60  # launched a minute ago: a start-up on a loaded host
    ranks = [reporter(channel, r) for r in range(2)]
    try:
        ranks[1].send(Progress(steps=[StepEntry(step=1, step_time_s=0.01, compute_s=0.01)]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            1 not in channel.snapshot().ranks
            or 0 not in channel.snapshot().ranks
            or channel.snapshot().first_step_at is None
        ):
            time.sleep(0.02)
        watching = watcher(channel, StandInLauncher(2), heartbeat_timeout_s=30, hang_timeout_s=5)
        watching._pump()
        assert watching._check() is None  # rank 0's first step is due within the hang timeout of rank 1's
    finally:
        for r in ranks:
            r.close()


def test_the_loss_is_the_mean_over_ranks_and_final_loss_the_mean_of_their_last_losses(channel):
    rows = []
    ranks = [reporter(channel, r) for r in range(2)]
    for step, (zero, one) in enumerate([(1.0, 3.0), (0.5, 1.5), (0.25, 0.75)], start=1):
        metrics = {"loss": zero, "lr": 0.1, "step_time_s": 0.01}
        ranks[0].send(Progress(steps=[StepEntry(step=step, step_time_s=0.01, metrics=metrics)]))
        ranks[1].send(Progress(steps=[StepEntry(step=step, step_time_s=0.01, loss=one)]))
    ranks[0].send(Finished(step=3, params_sha256="ab" * 32, loss=0.25))
    ranks[1].send(Finished(step=3, loss=0.75))
    for r in ranks:
        r.close()
    deadline = time.monotonic() + 30
    while channel.snapshot().finished is None and time.monotonic() < deadline:
        time.sleep(0.02)
    launcher = StandInLauncher(2)
    launcher.exits = [NodeExit(0, 0), NodeExit(1, 0)]
    handle = AttemptHandle(attempt=1, nodes=2, started_at=time.time(), logs={})
    watch = AttemptWatcher(
        launcher,
        handle,
        channel,
        WatchLimits(heartbeat_timeout_s=30, hang_timeout_s=30),
        world_size=2,
        resumed_from_step=0,
        on_metrics=rows.extend,
        on_event=lambda event: None,
        final_step=3,
    )
    result = watch.run(poll_s=0.05)
    assert result.outcome == Outcome.SUCCEEDED, result.reason
    assert [(step, value) for key, value, step, _ in rows if key == "loss"] == [(1, 2.0), (2, 1.0), (3, 0.5)]
    assert {value for key, value, _, _ in rows if key == "lr"} == {0.1}  # rank 0's, as logged
    assert result.finished["loss"] == 0.5 and result.finished["params_sha256"] == "ab" * 32
    assert result.totals["steps"] == 3  # rank 0's steps, counted once


class ScriptedExits(StandInLauncher):
    """Each poll answers the next node exits of a script; the last one stays."""

    def __init__(self, script: list[list[NodeExit]]):
        super().__init__(2)
        self.script = script
        self.polls = 0
        self.at_the_end = lambda: None  # called once, when the script reaches its last line

    def poll(self, handle):
        self.polls += 1
        if self.polls == len(self.script):
            self.at_the_end()
        return list(self.script[min(self.polls, len(self.script)) - 1])


def plain_watcher(channel, launcher, **limits) -> AttemptWatcher:
    handle = AttemptHandle(attempt=1, nodes=2, started_at=time.time(), logs={})
    return AttemptWatcher(
        launcher,
        handle,
        channel,
        WatchLimits(heartbeat_timeout_s=1, hang_timeout_s=1, **limits),
        2,
        0,
        lambda rows: None,
        lambda event: None,
        plain=True,
    )


def test_a_node_whose_workers_finished_is_not_a_crash_while_its_peer_still_works(channel):
    # node 1's worker exits 0 and is gone before its agent records the code; node 1's agent then
    # waits at torchrun's exit barrier while node 0 works on for a while (rank 0 saving the model)
    gone = [NodeExit(0, None), NodeExit(1, None, workers_lost=True)]
    waiting = [NodeExit(0, None), NodeExit(1, None, workers_finished=True)]
    launcher = ScriptedExits([gone] * 5 + [waiting] * 40 + [[NodeExit(0, 0), NodeExit(1, 0)]])
    started = time.monotonic()
    result = plain_watcher(channel, launcher, exit_timeout_s=60).run(poll_s=0.01)
    assert result.outcome == Outcome.SUCCEEDED, result.reason
    assert launcher.polls >= 46  # it watched on through node 0's extra work
    assert time.monotonic() - started < 20  # and did not wait out a dead worker's agent (60 s)


def test_a_node_still_running_long_after_its_peer_finished_is_a_hang_of_that_node(channel):
    launcher = ScriptedExits(
        [[NodeExit(0, None), NodeExit(1, None, workers_finished=True)], [NodeExit(0, None), NodeExit(1, 0)]]
    )
    started = time.monotonic()
    result = plain_watcher(channel, launcher, exit_timeout_s=0.5).run(poll_s=0.02)
    assert result.outcome == Outcome.HUNG
    assert 0.5 <= time.monotonic() - started < 10
    assert "node 0 still running" in result.reason and "after node 1 finished" in result.reason, result.reason
    assert "fault_tolerance.exit_timeout_s" in result.reason
    assert result.evidence.details["running_nodes"] == [0] and result.evidence.details["finished_nodes"] == [1]


def test_a_dead_worker_is_still_a_crash(channel):
    # a worker gone without a recorded exit 0, whose agent then reports the failure
    gone = [NodeExit(0, None), NodeExit(1, None, workers_lost=True)]
    launcher = ScriptedExits([gone] * 5 + [[NodeExit(0, None), NodeExit(1, 1, worker_returncode=-11)]])
    result = plain_watcher(channel, launcher, exit_timeout_s=60).run(poll_s=0.01)
    assert result.outcome == Outcome.CRASHED, result.reason


STORE_GONE = (
    "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: "
    "The connection to the C10d store has failed. See inner exception for details.",
)


def test_a_node_that_lost_the_rendezvous_store_waits_for_the_node_that_hosted_it(channel):
    # rank 0 crashes; node 1's agent, whose store lived in node 0's agent, fails first, without a rank
    lost = [NodeExit(0, None), NodeExit(1, 1, log_tail=STORE_GONE)]
    crashed = RankExit(0, 0, 1, observed_at=time.time() + 5, root_cause=True, stderr_tail=("ValueError: boom",))
    both = [NodeExit(0, 1, ranks=(crashed,)), NodeExit(1, 1, log_tail=STORE_GONE)]
    launcher = ScriptedExits([lost] * 30 + [both])
    result = plain_watcher(channel, launcher, exit_timeout_s=60, plain_startup_window_s=0).run(poll_s=0.01)
    assert launcher.polls > 30
    assert result.outcome == Outcome.CRASHED, result.reason
    assert "rank 0 on node 0 exited with code 1" in result.reason and "ValueError: boom" in result.reason


def test_a_node_that_lost_the_store_while_its_host_runs_on_is_judged_by_its_own_log(channel, monkeypatch):
    monkeypatch.setattr("trainflow.orchestrator.watcher.AGENT_EXIT_WAIT_S", 0.3)
    launcher = ScriptedExits([[NodeExit(0, None), NodeExit(1, 1, log_tail=STORE_GONE)]])
    result = plain_watcher(channel, launcher, exit_timeout_s=60).run(poll_s=0.01)
    assert result.outcome == Outcome.INFRA, result.reason
    assert "rendezvous failed" in result.reason and "node 1" in result.reason


PEER_GONE = ("RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:3726",)


def test_a_rank_that_only_saw_its_peer_go_waits_for_the_peers_node_to_exit(channel):
    # rank 1 exits with its own error; rank 0's collective fails at once and its node exits first,
    # while node 1's agent, slow on a loaded machine, has not yet recorded rank 1's exit
    echo = RankExit(0, 0, 1, observed_at=time.time(), root_cause=True, stderr_tail=PEER_GONE)
    first = [NodeExit(0, 1, ranks=(echo,)), NodeExit(1, None)]
    cause = RankExit(1, 0, 3, observed_at=time.time() + 1, root_cause=True, stderr_tail=("GPU 0: ECC error",))
    launcher = ScriptedExits([first] * 30 + [[NodeExit(0, 1, ranks=(echo,)), NodeExit(1, 1, ranks=(cause,))]])
    result = plain_watcher(channel, launcher, exit_timeout_s=60, plain_startup_window_s=0).run(poll_s=0.01)
    assert launcher.polls > 30
    assert result.outcome == Outcome.CRASHED, result.reason
    assert "rank 1 on node 1 exited with code 3" in result.reason and "ECC error" in result.reason


def test_a_peers_error_report_alone_waits_for_the_node_still_running(channel):
    # a runtime script: rank 0 reported the lost connection over the channel before its node exited
    rank0 = reporter(channel, 0)
    rank0.send(Progress(steps=[StepEntry(step=12, step_time_s=0.01)]))
    rank0.send(Error(step=12, type="RuntimeError", message=PEER_GONE[0]))
    rank0.close()
    deadline = time.monotonic() + 30
    while not channel.snapshot().errors and time.monotonic() < deadline:
        time.sleep(0.01)
    cause = RankExit(1, 0, 3, observed_at=time.time() + 1, root_cause=True, stderr_tail=("ValueError: boom",))
    ended = [NodeExit(0, 1), NodeExit(1, 1, ranks=(cause,))]
    launcher = ScriptedExits([[NodeExit(0, 1), NodeExit(1, None)]] * 30 + [ended])
    result = watcher(channel, launcher, heartbeat_timeout_s=30, hang_timeout_s=30).run(poll_s=0.01)
    assert launcher.polls > 30
    assert result.outcome == Outcome.CRASHED, result.reason
    assert "rank 1 on node 1 exited with code 3" in result.reason, result.reason


def test_a_peers_echo_with_the_other_node_running_on_is_judged_after_the_wait(channel, monkeypatch):
    monkeypatch.setattr("trainflow.orchestrator.watcher.AGENT_EXIT_WAIT_S", 0.3)
    echo = RankExit(0, 0, 1, observed_at=time.time() + 1, root_cause=True, stderr_tail=PEER_GONE)
    launcher = ScriptedExits([[NodeExit(0, 1, ranks=(echo,)), NodeExit(1, None)]])
    result = plain_watcher(channel, launcher, exit_timeout_s=60, plain_startup_window_s=0).run(poll_s=0.01)
    assert result.outcome == Outcome.CRASHED, result.reason
    assert "rank 0 on node 0" in result.reason and "Connection closed by peer" in result.reason


def test_a_plain_scripts_node_whose_relay_falls_silent_is_lost(channel, tmp_path):
    # node 0's relay heartbeats on; node 1's stream stays open but says nothing after its hello, as
    # a node cut off the network does
    live = NodeRelay(channel.address, channel.token, node=0, attempt=1, heartbeat_interval_s=0.1, scratch=str(tmp_path))
    host, port = channel.address.rsplit(":", 1)
    cut = socket.create_connection((host, int(port)))
    try:
        hello = NodeHello(token=channel.token, node=1, attempt=1, version=PROTOCOL_VERSION)
        cut.sendall(encode(hello))
        started = time.monotonic()
        running, ended = [NodeExit(0, None), NodeExit(1, None)], [NodeExit(0, 0), NodeExit(1, 0)]
        launcher = ScriptedExits([running] * 500 + [ended])  # ends by itself after 10 s of polls at most
        result = plain_watcher(channel, launcher).run(poll_s=0.02)
        assert result.outcome == Outcome.NODE_LOST, result.reason
        silent = result.evidence.silent_node
        assert silent is not None and silent.node == 1 and silent.node_state == "running", result.evidence
        assert result.evidence.as_dict()["silent_s"] >= 1.0  # the record: the silent node's fields at its top
        assert "node 1 silent for" in result.reason
        assert time.monotonic() - started >= 1.0  # the heartbeat timeout, never before
    finally:
        cut.close()
        live.close(timeout=2)


def test_a_plain_scripts_node_whose_relay_closed_its_stream_is_judged_by_its_exit(channel, tmp_path):
    (tmp_path / "1").mkdir()
    live = NodeRelay(channel.address, channel.token, node=0, attempt=1, heartbeat_interval_s=0.1, scratch=str(tmp_path))
    gone = NodeRelay(
        channel.address, channel.token, node=1, attempt=1, heartbeat_interval_s=0.1, scratch=str(tmp_path / "1")
    )
    try:
        gone.close(timeout=2)  # its agent is on its way out: the exit, not the silence, decides
        launcher = ScriptedExits([[NodeExit(0, None), NodeExit(1, None)]] * 150 + [[NodeExit(0, 0), NodeExit(1, 0)]])
        launcher.at_the_end = lambda: live.close(timeout=2)  # node 0's agent ends with its relay
        result = plain_watcher(channel, launcher).run(poll_s=0.02)
        assert result.outcome == Outcome.SUCCEEDED, result.reason
    finally:
        live.close(timeout=2)
