"""An in-process backend for testing the flow's branching in seconds: each attempt's ranks are
threads that speak the real status channel (with the run's token) and end as the test scripts them;
no torchrun, no processes. The watcher, the failure policy and every task run for real."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from trainflow.backends.base import Allocation, AttemptHandle, AttemptPlan, NodeExit, RankExit, ReleaseReport
from trainflow.contracts.status_protocol import Checkpoint, Finished, Progress, Started, StepEntry
from trainflow.orchestrator.status import StatusServer
from trainflow.runspec import RunSpec
from trainflow.runtime.reporter import StatusReporter


class End(str, Enum):
    finish = "finish"  # every rank reports finished, every node exits 0
    crash = "crash"  # the node's rank exits 1 after `steps` (a RuntimeError in its stderr)
    silent = "silent"  # the node's rank stops speaking after `steps`; its node never exits (a lost node)
    launch_fails = "launch_fails"  # the backend cannot start the attempt at all
    interrupted = "interrupted"  # the orchestrator is told to stop while launching (Prefect's cancel: SIGTERM)


@dataclass(frozen=True)
class Act:
    """What one attempt does."""

    end: End
    steps: int = 0  # the last step every rank reports (finish: the spec's last step)
    node: int = 0  # the node that crashes or goes silent
    checkpoint_at: int | None = None  # rank 0 reports a checkpoint there (never written: the snapshot fails it)


@dataclass
class ScriptedAttempt(AttemptHandle):
    done: dict[int, threading.Event] = field(default_factory=dict)  # node -> its rank threads ended
    returncodes: dict[int, int | None] = field(default_factory=dict)
    stop_event: threading.Event = field(default_factory=threading.Event)


class ScriptedLauncher:
    name = "scripted"

    def __init__(self, acts: list[Act]):
        self.acts = acts
        self.channel: StatusServer | None = None  # the run's status channel, set when provision opens it
        self.provisioned: list[Path] = []
        self.released: list[Path] = []
        self.launched_world_sizes: list[int] = []
        self.threads: list[threading.Thread] = []
        self.lost: list[str] = []  # what a reporter would have stopped its worker for

    def provision(self, spec: RunSpec, run_id: str, scratch: Path) -> Allocation:
        scratch.mkdir(parents=True, exist_ok=True)
        self.provisioned.append(scratch)
        nodes = spec.resources.nodes
        return Allocation(run_id=run_id, backend=self.name, nodes=nodes, scratch=scratch, slots=list(range(nodes)))

    def launch(self, spec: RunSpec, allocation: Allocation, plan: AttemptPlan) -> AttemptHandle:
        act = self.acts[plan.attempt - 1]
        if act.end == End.launch_fails:
            raise RuntimeError("the scripted backend could not start the attempt")
        if act.end == End.interrupted:
            raise KeyboardInterrupt("SIGTERM")
        attempt_dir = allocation.scratch / f"attempt-{plan.attempt}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        procs = spec.resources.procs_per_node
        world = spec.world_size
        self.launched_world_sizes.append(world)
        handle = ScriptedAttempt(
            attempt=plan.attempt,
            nodes=spec.resources.nodes,
            started_at=time.time(),
            logs={},
            procs_per_node=procs,
            slots=list(allocation.slots),
        )
        for node in range(handle.nodes):
            log = attempt_dir / f"node-{node}.log"
            log.write_text(f"scripted node {node}, attempt {plan.attempt}\n")
            handle.logs[node] = log
            handle.done[node] = threading.Event()
            handle.returncodes[node] = None
            ranks = [node * procs + local for local in range(procs)]
            thread = threading.Thread(
                target=self._node,
                args=(spec, plan, act, handle, node, ranks, world),
                name=f"scripted-node-{node}",
                daemon=True,
            )
            self.threads.append(thread)
            thread.start()
        return handle

    def _node(self, spec, plan, act, handle: ScriptedAttempt, node, ranks, world) -> None:
        reporters = {
            rank: StatusReporter(
                plan.status_address,
                plan.status_token,
                {"rank": rank, "node": node, "attempt": plan.attempt, "pid": os.getpid() * 1000 + rank},
                heartbeat_interval_s=0.2,
                orchestrator_timeout_s=60.0,
                on_lost=self._lost,
            )
            for rank in ranks
        }
        for reporter in reporters.values():
            reporter.send(Started(world_size=world))
        # as a real worker is, by its heartbeats, long before it ends: known to the orchestrator
        deadline = time.monotonic() + 60
        while not set(ranks) <= set(self.channel.snapshot().ranks) and time.monotonic() < deadline:
            time.sleep(0.01)
        last = spec.workload.steps if act.end == End.finish else act.steps
        for step in range(1, last + 1):
            for reporter in reporters.values():
                reporter.send(
                    Progress(
                        steps=[StepEntry(step=step, step_time_s=0.01, t=time.time(), metrics={"loss": 1.0 / step})]
                    )
                )
                if step == act.checkpoint_at and reporter is reporters.get(0):
                    reporter.send(
                        Checkpoint(
                            step=step,
                            prefix=f"{spec.name}/step-{step}",
                            status="failed",
                            reason="scripted: nothing was written",
                            bytes=0,
                            stall_s=0.0,
                        )
                    )
        # ranks in step (as a collective keeps them): every rank's last step is known to the
        # orchestrator before any of them ends, so an attempt's last step is the act's
        deadline = time.monotonic() + 60
        while not self._all_at(last, world) and time.monotonic() < deadline:
            time.sleep(0.01)
        ending_here = act.node == node
        if act.end == End.finish:
            for reporter in reporters.values():
                reporter.send(Finished(step=last, params_sha256="0" * 64, loss=1.0 / max(last, 1)))
        if act.end == End.finish or ending_here:
            for reporter in reporters.values():
                reporter.close()  # what was sent is delivered, then the connection ends
        if act.end == End.crash and ending_here:
            handle.returncodes[node] = 1
        elif act.end == End.finish:
            handle.returncodes[node] = 0
        else:  # a silent node's processes, and the healthy nodes of a failed attempt, end only when stopped
            handle.stop_event.wait()
            for reporter in reporters.values():
                reporter.close()
            handle.returncodes[node] = -15
        handle.done[node].set()

    def _lost(self, message: str) -> None:
        """A real worker exits when the orchestrator is gone; a thread of the test process must not."""
        self.lost.append(message)

    def _all_at(self, step: int, world: int) -> bool:
        ranks = self.channel.snapshot().ranks
        return len(ranks) == world and all(rank.step >= step for rank in ranks.values())

    def poll(self, handle: ScriptedAttempt) -> list[NodeExit]:
        exits = []
        act = self.acts[handle.attempt - 1]
        for node in range(handle.nodes):
            code = handle.returncodes[node]
            ranks = ()
            if code == 1:
                rank = node * handle.procs_per_node
                ranks = (
                    RankExit(
                        rank=rank,
                        local_rank=0,
                        exitcode=1,
                        observed_at=time.time(),
                        root_cause=True,
                        stderr_tail=(f"RuntimeError: scripted crash at step {act.steps}",),
                    ),
                )
            exits.append(NodeExit(node=node, returncode=code, ranks=ranks))
        return exits

    def stop(self, handle: ScriptedAttempt, grace_s: float) -> int:
        running = [node for node, code in handle.returncodes.items() if code is None]
        handle.stop_event.set()
        for node in handle.done:
            handle.done[node].wait(30)
        return len(running)

    def replace_node(self, allocation: Allocation, slot: int) -> bool:
        return False  # a lost node does not come back: the run goes on without it where min_nodes allows

    def release(self, allocation: Allocation) -> ReleaseReport:
        report = ReleaseReport()
        for thread in self.threads:
            thread.join(30)
        report.survivors += [f"thread {t.name} still running" for t in self.threads if t.is_alive()]
        report.remove_folder(allocation.scratch)
        self.released.append(allocation.scratch)
        return report
