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
import time
from pathlib import Path

from trainflow.backends import register
from trainflow.backends.base import Allocation, AttemptHandle, AttemptPlan, NodeExit, ReleaseReport
from trainflow.backends.bounded_output import torchrun_log_dir
from trainflow.backends.netns import cut_node_link
from trainflow.backends.processes import describe, job_processes
from trainflow.backends.quick_rendezvous import POLL_ENV, poll_interval_s
from trainflow.backends.shared_copies import remove_recorded
from trainflow.backends.slurm import commands
from trainflow.backends.slurm.allocation import SlurmAllocation, SlurmAttempt
from trainflow.backends.slurm.batch import batch_script, job_name, sbatch_command
from trainflow.backends.slurm.commands import JobState, SlurmError
from trainflow.backends.slurm.config import slurm_config
from trainflow.backends.slurm.job_end import SlurmNodeExit, from_job, read_exit, time_limit_warning, wait_inactive
from trainflow.backends.slurm.links import ClusterLinks
from trainflow.backends.slurm.node_agent import LAUNCH_FILE, exit_file
from trainflow.backends.slurm.on_node import node_stacks, probe_node
from trainflow.backends.torchrun_report import failed_ranks_with_evidence, log_tail, root_cause_exitcode
from trainflow.backends.worker import worker_config
from trainflow.contracts import Outcome
from trainflow.runspec import SpecError
from trainflow.worker_config import JOB_ENV

SCHEDULER_POLL_S = 0.5  # how often poll asks slurmctld; exit files are read on every poll
GONE_TIMEOUT_S = 120.0  # a job on a node that stopped answering ends once Slurm marks the node DOWN


class ProvisionError(RuntimeError):
    """The cluster cannot run what the spec asks for."""


class SlurmNodeTask:
    """The part of an attempt's job on one node, with a process handle's poll and send_signal
    (drills signal through Slurm, as a preemption would)."""

    def __init__(self, launcher: SlurmLauncher, handle: SlurmAttempt, node: int):
        self.launcher, self.handle, self.node = launcher, handle, node

    def poll(self) -> int | None:
        return next(e.returncode for e in self.launcher.poll(self.handle) if e.node == self.node)

    def send_signal(self, sig: int) -> None:
        self.handle.signalled_at = time.time()  # by trainflow itself: not the time limit's warning
        commands.slurm("scancel", f"--signal={signal.Signals(sig).name.removeprefix('SIG')}", self.handle.job_id)


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
    shares_scratch = True  # the run's folder is on a filesystem the nodes share (drills open their fault gate there)

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
            raise ProvisionError(
                f"resources.backend: slurm needs Slurm's commands on PATH ({', '.join(missing)} "
                "missing): run on a login node, or install slurm-client and set SLURM_CONF"
            )
        try:
            nodes = commands.partition_nodes(slurm_config(spec).partition)
        except SlurmError as exc:
            raise ProvisionError(f"resources.backend: slurm: the cluster does not answer: {exc}") from None
        if not nodes:
            raise ProvisionError(
                f"slurm.partition: {slurm_config(spec).partition or 'the default partition'} has no nodes"
            )
        if len(nodes) < spec.resources.nodes:
            raise ProvisionError(f"resources.nodes: {spec.resources.nodes} asked, the partition has {len(nodes)}")
        return nodes

    def provision(self, spec, run_id: str, scratch: Path) -> SlurmAllocation:
        nodes = self._partition(spec)
        try:
            host = status_host(spec)
        except SlurmError as exc:
            raise ProvisionError(f"slurm: the cluster does not answer: {exc}") from None
        scratch.mkdir(parents=True, exist_ok=True)
        hosts = sorted(nodes)
        # links: a cluster brought up by local_cluster, whose node links can be cut for drills
        return SlurmAllocation(
            run_id=run_id,
            backend=self.name,
            nodes=spec.resources.nodes,
            scratch=scratch,
            status_host=host,
            slots=list(range(len(hosts))),
            hosts=hosts,
            partition=slurm_config(spec).partition,
            links=ClusterLinks.for_cluster(hosts),
        )

    def launch(self, spec, allocation: SlurmAllocation, plan: AttemptPlan) -> SlurmAttempt:
        attempt_dir = allocation.scratch / f"attempt-{plan.attempt}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        nodes = spec.resources.nodes
        logs = {}
        for node in range(nodes):
            config = worker_config(spec, allocation.run_id, plan, node, allocation.scratch / f"node-{node}")
            config.write(attempt_dir / f"node-{node}.json")
            logs[node] = attempt_dir / f"node-{node}.log"
        (attempt_dir / LAUNCH_FILE).write_text(
            json.dumps(
                {
                    "nodes": nodes,
                    "procs_per_node": spec.resources.procs_per_node,
                    "rdzv_id": f"{allocation.run_id}-{plan.attempt}",
                    "entrypoint": spec.workload.entrypoint,
                    "args": list(spec.workload.args),
                    "node_log_max_bytes": int(spec.tracking.max_node_log_mb * 2**20),
                }
            )
        )
        (attempt_dir / "job.sh").write_text(batch_script(spec, allocation.run_id, plan.attempt, attempt_dir))
        submit = sbatch_command(spec, allocation.run_id, attempt_dir, allocation.exclude)
        out = commands.slurm(*submit, env=self._environment(spec, allocation))
        job_id = out.strip().split(";")[0]
        allocation.jobs.append(job_id)
        handle = SlurmAttempt(
            attempt=plan.attempt,
            nodes=nodes,
            started_at=time.time(),
            logs=logs,
            procs_per_node=spec.resources.procs_per_node,
            job_id=job_id,
            run_id=allocation.run_id,
            attempt_dir=attempt_dir,
            hosts=allocation.hosts,
            warn_before_limit_s=slurm_config(spec).warn_before_limit_s,
        )
        handle.processes = {node: SlurmNodeTask(self, handle, node) for node in range(nodes)}
        return handle

    @staticmethod
    def _environment(spec, allocation: Allocation) -> dict[str, str]:
        env = commands.environment_with(
            {
                JOB_ENV: allocation.run_id,
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": str(max(1, int(spec.resources.cpu // spec.resources.procs_per_node))),
                "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p),
                POLL_ENV: str(poll_interval_s(spec.resources.nodes)),
            }
        )
        env.setdefault("TORCH_CPP_LOG_LEVEL", "INFO")
        return env

    def job(self, handle: SlurmAttempt, fresh: bool = False) -> JobState | None:
        """The attempt's job as Slurm sees it, asked at most every SCHEDULER_POLL_S."""
        if fresh or time.monotonic() - handle.asked_at > SCHEDULER_POLL_S:
            try:
                handle.job = commands.job_state(handle.job_id)
            except SlurmError:
                pass  # the controller is busy; the last answer stands
            handle.asked_at = time.monotonic()
            job = handle.job
            if job is not None and job.active and job.end_time and job.time_limit not in ("", "UNLIMITED"):
                handle.limit_ends_at = job.end_time  # once ended, EndTime is when it ended instead
            if job is not None and job.started and not handle.slots:
                handle.node_names = commands.expand_hostlist(job.nodelist)
                handle.slots = [self._slot(handle.hosts, name) for name in handle.node_names]
        return handle.job

    @staticmethod
    def _slot(hosts: list[str], name: str) -> int:
        if name not in hosts:
            hosts.append(name)
        return hosts.index(name)

    def poll(self, handle: SlurmAttempt) -> list[NodeExit]:
        job = self.job(handle)
        exits = []
        for node in range(handle.nodes):
            code = read_exit(exit_file(handle.attempt_dir, node))
            outcome, reason = None, ""
            if code is None and job is not None and not job.active:
                job = self.job(handle, fresh=True)  # the files are written before the job ends
                code = read_exit(exit_file(handle.attempt_dir, node))
                if code is None:
                    code, outcome, reason = from_job(job)
            if code is not None and outcome is None and (warning := time_limit_warning(handle, node)):
                outcome, reason = Outcome.PREEMPTED, warning
            failed = code not in (None, 0)
            worker = root_cause_exitcode(handle.logs[node]) if failed else None
            log_dir = torchrun_log_dir(handle.attempt_dir, node)
            ranks = failed_ranks_with_evidence(handle.logs[node], log_dir) if failed else ()
            tail = tuple(log_tail(handle.logs[node])) if failed and not ranks else ()
            exits.append(
                SlurmNodeExit(
                    node,
                    code,
                    worker_returncode=worker,
                    ranks=ranks,
                    log_tail=tail,
                    outcome=outcome,
                    reason=reason,
                )
            )
        if job is None and all(e.running for e in exits) and time.time() - handle.started_at > 5:
            exits = [
                SlurmNodeExit(
                    e.node,
                    -signal.SIGKILL,
                    outcome=Outcome.INFRA,
                    reason=f"job {handle.job_id} is no longer known to Slurm",
                )
                for e in exits
            ]
        return exits

    def probe(self, handle: SlurmAttempt, node: int) -> str:
        return probe_node(handle, node)

    def dump_stacks(self, handle: SlurmAttempt, pids_by_rank: dict[int, int]) -> dict[int, str]:
        return node_stacks(handle, pids_by_rank)

    def stop(self, handle: SlurmAttempt, grace_s: float) -> int:
        """Cancel the job (Slurm sends SIGCONT and SIGTERM, SIGKILL after KillWait) and wait until it
        is no longer active; returns how many nodes were still running."""
        job = self.job(handle, fresh=True)
        if job is None or not job.active:
            return 0
        running = sum(1 for e in self.poll(handle) if e.running)
        if not running and not wait_inactive([handle.job_id], grace_s):
            return 0  # every node had ended: the job ends by itself, recorded as it finished
        commands.slurm("scancel", handle.job_id)
        wait_inactive([handle.job_id], GONE_TIMEOUT_S)
        return running

    def replace_node(self, allocation: SlurmAllocation, slot: int) -> bool:
        """Leave the failed node out of the next attempts (--exclude); True while the partition still
        has enough other usable nodes for the whole job, False to continue on fewer (min_nodes)."""
        failed = allocation.hosts[slot]
        back = allocation.lost.may_return(slot)
        if back and slot in allocation.lost.replaced:  # a drill's replacement: the host serves again
            if failed in allocation.exclude:
                allocation.exclude.remove(failed)
        elif failed not in allocation.exclude:
            allocation.exclude.append(failed)
        if allocation.links is not None and back:
            allocation.links.restore(slot)  # the drill's link comes back; the node stays excluded all the same
        try:
            states = commands.partition_nodes(allocation.partition)
        except SlurmError:
            return False
        left = [n for n, s in states.items() if n not in allocation.exclude and commands.usable(s)]
        return len(left) >= allocation.nodes

    def signal_rank(self, allocation: SlurmAllocation, pid: int, sig: signal.Signals) -> None:
        if allocation.links is None:
            raise RuntimeError(
                "slurm: a rank's process can be signalled only on a cluster brought up on this "
                "machine (local_cluster); this cluster's nodes are out of reach"
            )
        os.kill(pid, sig)  # the cluster's nodes are this machine's namespaces: the pids are ours

    def preempt_node(self, handle: AttemptHandle, node: int) -> None:
        handle.processes[node].send_signal(signal.SIGTERM)  # through Slurm, as a preemption would

    def cut_node(self, allocation: SlurmAllocation, slot: int, permanent: bool, replaced_later: bool = False) -> str:
        return cut_node_link(
            allocation.links,
            allocation.lost,
            slot,
            permanent,
            replaced_later,
            without_links="node-loss needs a Slurm cluster brought up by local_cluster (its node links can be cut)",
        )

    def release(self, allocation: SlurmAllocation) -> ReleaseReport:
        report = ReleaseReport()
        jobs = allocation.jobs
        try:
            active = [j for j in jobs if (state := commands.job_state(j)) is not None and state.active]
            if active:
                commands.slurm("scancel", *active)
                report.stopped_processes = len(active)
            report.survivors += [f"slurm job {j} still {s}" for j, s in wait_inactive(jobs, GONE_TIMEOUT_S).items()]
            queued = commands.slurm("squeue", "--noheader", f"--name={job_name(allocation.run_id)}", "--format=%i %T")
            report.survivors += [
                f"slurm job {line.strip()} still queued" for line in queued.splitlines() if line.strip()
            ]
        except SlurmError as exc:
            report.survivors.append(f"slurm did not answer at release: {exc}")
        if allocation.links is not None:
            allocation.links.restore_all()
        # on a cluster on this machine the nodes' processes are visible here: they must be gone too
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while (left := job_processes(allocation.run_id)) and time.monotonic() < deadline:
            time.sleep(0.2)
        report.survivors += [describe(p) for p in left]
        report.removed_paths.extend(remove_recorded(allocation.scratch))  # what an agent killed outright left
        report.remove_folder(allocation.scratch)
        return report
