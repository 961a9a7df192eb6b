"""Slurm launcher: one batch job per attempt, followed through the scheduler and the workers' own
reports.

- provision reserves nothing at Slurm (a job per attempt is what can always be given back); it checks
  the commands and the partition and picks the address nodes reach the status channel on
- launch writes the worker configs and the batch script under the run's folder (it must be on a
  filesystem the nodes share, as TRAINFLOW_HOME on a cluster is) and submits with sbatch
- poll reads each node's exit file (written by its node agent) and, once the job has ended, Slurm's
  job state, reason and exit code for the nodes that could not write one
- stop and release cancel the job and wait until Slurm no longer lists it as active
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainflow.backends import register
from trainflow.backends.base import Allocation, AttemptHandle, AttemptPlan, NodeExit, ReleaseReport
from trainflow.backends.local import root_cause_exitcode
from trainflow.backends.processes import describe, job_processes
from trainflow.backends.slurm import commands
from trainflow.backends.slurm.batch import batch_script, job_name, sbatch_command
from trainflow.backends.slurm.commands import JobState, SlurmError
from trainflow.backends.slurm.config import slurm_config
from trainflow.backends.slurm.links import ClusterLinks
from trainflow.backends.slurm.node_agent import LAUNCH_FILE, exit_file, read_signal
from trainflow.backends.worker import worker_config
from trainflow.contracts import Outcome
from trainflow.spec import SpecError
from trainflow.worker_config import JOB_ENV

SCHEDULER_POLL_S = 0.5  # how often poll asks slurmctld; exit files are read on every poll
PROBE_TIMEOUT_S = 6.0
GONE_TIMEOUT_S = 120.0  # a job on a node that stopped answering ends once Slurm marks the node DOWN
# Slurm checks time limits periodically and may send --signal's warning up to 60 s early
WARNING_EARLY_S = 65.0

# what a job's own end says when no node agent could report (the node or the job was taken away)
JOB_END_OUTCOMES = {
    "NODE_FAIL": Outcome.NODE_LOST,
    "PREEMPTED": Outcome.PREEMPTED,
    "TIMEOUT": Outcome.PREEMPTED,
    "OUT_OF_MEMORY": Outcome.KILLED,
    "BOOT_FAIL": Outcome.INFRA,
    "DEADLINE": Outcome.PREEMPTED,
}


class ProvisionError(RuntimeError):
    """The cluster cannot run what the spec asks for."""


@dataclass(frozen=True)
class SlurmNodeExit(NodeExit):
    """A node's exit with Slurm's evidence: the job's state and reason, and the outcome they imply."""

    outcome: Outcome | None = None
    reason: str = ""


class SlurmNodeTask:
    """The part of an attempt's job on one node, with a process handle's poll and send_signal
    (drills signal through Slurm, as a preemption would)."""

    def __init__(self, launcher: SlurmLauncher, handle: AttemptHandle, node: int):
        self.launcher, self.handle, self.node = launcher, handle, node

    def poll(self) -> int | None:
        return next(e.returncode for e in self.launcher.poll(self.handle) if e.node == self.node)

    def send_signal(self, sig: int) -> None:
        self.handle.workers["signalled_at"] = time.time()  # by trainflow itself: not the time limit's warning
        commands.slurm("scancel", f"--signal={signal.Signals(sig).name.removeprefix('SIG')}",
                       self.handle.workers["job_id"])


def status_host(spec) -> str:
    """Where nodes reach the orchestrator: the spec's, TRAINFLOW_STATUS_HOST, else this machine's
    address on its route to the controller."""
    chosen = slurm_config(spec).status_host or os.environ.get("TRAINFLOW_STATUS_HOST")
    if chosen:
        return chosen
    controller = commands.controller_address()
    try:
        target = socket.gethostbyname(controller) if controller else None
    except OSError:
        target = None
    if not target or target.startswith("127."):
        return "127.0.0.1" if not target else target
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((target, 9))  # no packet is sent; the kernel picks the source address
        return sock.getsockname()[0]


@register("slurm")
class SlurmLauncher:
    name = "slurm"

    def preflight(self, spec) -> None:
        """Before anything is provisioned: Slurm's commands are here and the partition can hold the job."""
        try:
            self._partition(spec)
        except ProvisionError as exc:
            raise SpecError(str(exc)) from None

    @staticmethod
    def _partition(spec) -> dict[str, str]:
        missing = commands.missing_commands()
        if missing:
            raise ProvisionError(f"resources.backend: slurm needs Slurm's commands on PATH ({', '.join(missing)} "
                                 "missing): run on a login node, or install slurm-client and set SLURM_CONF")
        try:
            nodes = commands.partition_nodes(slurm_config(spec).partition)
        except SlurmError as exc:
            raise ProvisionError(f"resources.backend: slurm: the cluster does not answer: {exc}") from None
        if not nodes:
            raise ProvisionError(f"slurm.partition: {slurm_config(spec).partition or 'the default partition'} has no nodes")
        if len(nodes) < spec.resources.nodes:
            raise ProvisionError(f"resources.nodes: {spec.resources.nodes} asked, the partition has {len(nodes)}")
        return nodes

    def provision(self, spec, run_id: str, scratch: Path) -> Allocation:
        nodes = self._partition(spec)
        try:
            host = status_host(spec)
        except SlurmError as exc:
            raise ProvisionError(f"slurm: the cluster does not answer: {exc}") from None
        scratch.mkdir(parents=True, exist_ok=True)
        hosts = sorted(nodes)
        allocation = Allocation(run_id=run_id, backend=self.name, nodes=spec.resources.nodes, scratch=scratch,
                                status_host=host, slots=list(range(len(hosts))))
        allocation.details.update({"hosts": hosts, "exclude": [], "jobs": [], "partition": slurm_config(spec).partition})
        links = ClusterLinks.for_cluster(hosts)
        if links is not None:  # a cluster brought up by local_cluster: node links can be cut for drills
            allocation.details["network"] = links
        return allocation

    def launch(self, spec, allocation: Allocation, plan: AttemptPlan) -> AttemptHandle:
        attempt_dir = allocation.scratch / f"attempt-{plan.attempt}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        nodes = spec.resources.nodes
        handle = AttemptHandle(attempt=plan.attempt, nodes=nodes, started_at=time.time(), logs={},
                               procs_per_node=spec.resources.procs_per_node)
        for node in range(nodes):
            config = worker_config(spec, allocation.run_id, plan, node, allocation.scratch / f"node-{node}")
            config.write(attempt_dir / f"node-{node}.json")
            handle.logs[node] = attempt_dir / f"node-{node}.log"
        (attempt_dir / LAUNCH_FILE).write_text(json.dumps({
            "nodes": nodes, "procs_per_node": spec.resources.procs_per_node,
            "rdzv_id": f"{allocation.run_id}-{plan.attempt}",
            "entrypoint": spec.workload.entrypoint, "args": list(spec.workload.args),
        }))
        (attempt_dir / "job.sh").write_text(batch_script(spec, allocation.run_id, plan.attempt, attempt_dir))
        submit = sbatch_command(spec, allocation.run_id, attempt_dir, allocation.details["exclude"])
        out = commands.slurm(*submit, env=self._environment(spec, allocation))
        job_id = out.strip().split(";")[0]
        allocation.details["jobs"].append(job_id)
        handle.workers = {"job_id": job_id, "run_id": allocation.run_id, "attempt_dir": attempt_dir, "job": None, "asked_at": 0.0,
                          "exclude": list(allocation.details["exclude"]), "hosts": allocation.details["hosts"],
                          "warn_before_limit_s": slurm_config(spec).warn_before_limit_s, "signalled_at": None,
                          "limit_ends_at": None}
        handle.processes = {node: SlurmNodeTask(self, handle, node) for node in range(nodes)}
        return handle

    @staticmethod
    def _environment(spec, allocation: Allocation) -> dict[str, str]:
        env = commands.environment_with({
            JOB_ENV: allocation.run_id,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": str(max(1, int(spec.resources.cpu // spec.resources.procs_per_node))),
            "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p),
        })
        env.setdefault("TORCH_CPP_LOG_LEVEL", "INFO")
        return env

    def job(self, handle: AttemptHandle, fresh: bool = False) -> JobState | None:
        """The attempt's job as Slurm sees it, asked at most every SCHEDULER_POLL_S."""
        view = handle.workers
        if fresh or time.monotonic() - view["asked_at"] > SCHEDULER_POLL_S:
            try:
                view["job"] = commands.job_state(view["job_id"])
            except SlurmError:
                pass  # the controller is busy; the last answer stands
            view["asked_at"] = time.monotonic()
            job = view["job"]
            if job is not None and job.active and job.end_time and job.time_limit not in ("", "UNLIMITED"):
                view["limit_ends_at"] = job.end_time  # once ended, EndTime is when it ended instead
            if job is not None and job.started and not handle.slots:
                names = commands.expand_hostlist(job.nodelist)
                view["nodes"] = names
                handle.slots = [self._slot(view["hosts"], name) for name in names]
        return view["job"]

    @staticmethod
    def _slot(hosts: list[str], name: str) -> int:
        if name not in hosts:
            hosts.append(name)
        return hosts.index(name)

    def poll(self, handle: AttemptHandle) -> list[NodeExit]:
        job = self.job(handle)
        attempt_dir: Path = handle.workers["attempt_dir"]
        exits = []
        for node in range(handle.nodes):
            code = _read_exit(exit_file(attempt_dir, node))
            outcome, reason = None, ""
            if code is None and job is not None and not job.active:
                job = self.job(handle, fresh=True)  # the files are written before the job ends
                code = _read_exit(exit_file(attempt_dir, node))
                if code is None:
                    code, outcome, reason = _from_job(job)
            if code is not None and outcome is None and (warning := _time_limit_warning(handle, node)):
                outcome, reason = Outcome.PREEMPTED, warning
            worker = root_cause_exitcode(handle.logs[node]) if code not in (None, 0) else None
            exits.append(SlurmNodeExit(node, code, worker_returncode=worker, outcome=outcome, reason=reason))
        if job is None and all(e.running for e in exits) and time.time() - handle.started_at > 5:
            exits = [SlurmNodeExit(e.node, -signal.SIGKILL, outcome=Outcome.INFRA,
                                   reason=f"job {handle.workers['job_id']} is no longer known to Slurm")
                     for e in exits]
        return exits

    def probe(self, handle: AttemptHandle, node: int) -> str:
        """A silent node as Slurm and the node itself see it: its state at the controller, and the
        job's processes there, asked through a step inside the job (no answer: unreachable)."""
        names = handle.workers.get("nodes") or []
        if node >= len(names):
            return "unknown"
        name = names[node]
        slurm_state = commands.node_state(name)
        evidence = f"slurm node {name}: {slurm_state.get('State', '?')}"
        if slurm_state.get("Reason"):
            evidence += f" ({slurm_state['Reason']})"
        handle.workers.setdefault("node_states", {})[node] = evidence
        answer = self._on_node(handle, name, "state", PROBE_TIMEOUT_S)
        if answer in ("workers-stopped", "running", "gone"):
            return answer
        return f"unreachable; {evidence}"

    def dump_stacks(self, handle: AttemptHandle, pids_by_rank: dict[int, int]) -> dict[int, str]:
        """Every rank's Python stacks, read with py-spy on each node through a step inside the job."""
        stacks: dict[int, str] = {}
        for name in handle.workers.get("nodes") or []:
            answer = self._on_node(handle, name, "stacks", 60.0)
            try:
                stacks.update({int(rank): text for rank, text in json.loads(answer or "{}").items()})
            except ValueError:
                continue
        return {rank: stacks.get(rank, "no stack: the node did not answer") for rank in sorted(pids_by_rank)}

    @staticmethod
    def _on_node(handle: AttemptHandle, name: str, what: str, timeout_s: float) -> str | None:
        run_id = handle.workers["run_id"]
        command = ["srun", f"--jobid={handle.workers['job_id']}", "--overlap", "--nodes=1", "--ntasks=1",
                   f"--nodelist={name}", "--quiet", sys.executable, "-m", "trainflow.backends.slurm.node_probe",
                   what, run_id]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                    stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    def stop(self, handle: AttemptHandle, grace_s: float) -> int:
        """Cancel the job (Slurm sends SIGCONT and SIGTERM, SIGKILL after KillWait) and wait until it
        is no longer active; returns how many nodes were still running."""
        job = self.job(handle, fresh=True)
        if job is None or not job.active:
            return 0
        running = sum(1 for e in self.poll(handle) if e.running)
        job_id = handle.workers["job_id"]
        if not running and not _wait_inactive([job_id], grace_s):
            return 0  # every node had ended: the job ends by itself, recorded as it finished
        commands.slurm("scancel", job_id)
        _wait_inactive([job_id], GONE_TIMEOUT_S)
        return running

    def replace_node(self, allocation: Allocation, slot: int) -> bool:
        """Leave the failed node out of the next attempts (--exclude); True while the partition still
        has enough other usable nodes for the whole job, False to continue on fewer (min_nodes)."""
        hosts = allocation.details["hosts"]
        failed = hosts[slot]
        if failed not in allocation.details["exclude"]:
            allocation.details["exclude"].append(failed)
        links: ClusterLinks | None = allocation.details.get("network")
        if links is not None and slot not in allocation.details.get("unrecoverable", set()):
            links.restore(slot)  # the drill's link comes back; the node stays excluded all the same
        try:
            states = commands.partition_nodes(allocation.details["partition"])
        except SlurmError:
            return False
        left = [n for n, s in states.items() if n not in allocation.details["exclude"] and commands.usable(s)]
        return len(left) >= allocation.nodes

    def release(self, allocation: Allocation) -> ReleaseReport:
        report = ReleaseReport()
        jobs = allocation.details.get("jobs", [])
        try:
            active = [j for j in jobs if (state := commands.job_state(j)) is not None and state.active]
            if active:
                commands.slurm("scancel", *active)
                report.stopped_processes = len(active)
            report.survivors += [f"slurm job {j} still {s}" for j, s in _wait_inactive(jobs, GONE_TIMEOUT_S).items()]
            queued = commands.slurm("squeue", "--noheader", f"--name={job_name(allocation.run_id)}", "--format=%i %T")
            report.survivors += [f"slurm job {line.strip()} still queued" for line in queued.splitlines() if line.strip()]
        except SlurmError as exc:
            report.survivors.append(f"slurm did not answer at release: {exc}")
        links: ClusterLinks | None = allocation.details.get("network")
        if links is not None:
            links.restore_all()
        # on a cluster on this machine the nodes' processes are visible here: they must be gone too
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while (left := job_processes(allocation.run_id)) and time.monotonic() < deadline:
            time.sleep(0.2)
        report.survivors += [describe(p) for p in left]
        report.remove_folder(allocation.scratch)
        return report


def _read_exit(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _time_limit_warning(handle: AttemptHandle, node: int) -> str | None:
    """Slurm's evidence that a node's SIGTERM was the time limit's warning (--signal=TERM@N): the
    spec asked for one, trainflow sent no signal itself, and it came within the warning's window
    before the limit Slurm set for the job."""
    view = handle.workers
    received = read_signal(view["attempt_dir"], node)
    warn, ends_at = view.get("warn_before_limit_s"), view.get("limit_ends_at")
    if received is None or received[0] != "TERM" or not warn or ends_at is None or view.get("signalled_at"):
        return None
    before = ends_at - received[1]
    if not 0 <= before <= warn + WARNING_EARLY_S:
        return None
    limit = view["job"].time_limit if view.get("job") else "?"
    return (f"slurm job {view['job_id']}: the time limit's warning, SIGTERM {before:.0f}s before its "
            f"{limit} limit (--signal=TERM@{warn})")


def _from_job(job: JobState | None) -> tuple[int, Outcome | None, str]:
    """A node's exit when its agent could not say: from the job's end at Slurm."""
    if job is None:
        return -signal.SIGKILL, Outcome.INFRA, "the job is no longer known to Slurm"
    reason = f"slurm job {job.job_id} {job.state} (reason {job.reason}, exit code {job.exit_code}:{job.exit_signal})"
    code = -job.exit_signal if job.exit_signal else (job.exit_code or -signal.SIGKILL)
    return code, JOB_END_OUTCOMES.get(job.state), reason


def _wait_inactive(jobs: list[str], timeout_s: float) -> dict[str, str]:
    """Wait until none of `jobs` is active; returns those still active at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        active = {}
        for job_id in jobs:
            try:
                state = commands.job_state(job_id)
            except SlurmError as exc:
                active[job_id] = f"unknown ({exc})"
                continue
            if state is not None and state.active:
                active[job_id] = state.state
        if not active or time.monotonic() > deadline:
            return active
        time.sleep(0.3)
