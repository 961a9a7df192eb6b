"""The local backend's Launcher: one torchrun agent per node, each in a session of its own, and the
abilities drills use to break a run from outside (signal a rank, preempt a node, cut its link)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from contextlib import nullcontext
from pathlib import Path

import psutil

from trainflow.backends import register
from trainflow.backends.base import Allocation, AttemptHandle, AttemptPlan, NodeExit, ReleaseReport
from trainflow.backends.bounded_output import torchrun_log_dir
from trainflow.backends.job_tmp import create_job_temp_dir, job_temp_dir
from trainflow.backends.local.agent_command import (
    LOOPBACK,
    agent_command,
    agent_environment,
    output_environment,
    torchrun_arguments,
)
from trainflow.backends.local.allocation import LocalAllocation
from trainflow.backends.local.capacity import local_capacity_problem
from trainflow.backends.local.config import LocalNetwork, local_config
from trainflow.backends.local.observe import alive, node_state, node_workers, rank_stacks, session_members
from trainflow.backends.local.warm_pools import close_pools, head_start, start_pools
from trainflow.backends.netns import NetworkError, NodeNetwork, cut_node_link
from trainflow.backends.parent_death import ending_with_this_process
from trainflow.backends.ports import free_port, is_listening
from trainflow.backends.processes import describe, job_processes, signal_session, terminate, wait_until_gone
from trainflow.backends.rank_records import RECORDS_ENV, note_ended, read_exits, read_ranks, read_replaced, records_path
from trainflow.backends.shared_copies import remove_recorded
from trainflow.backends.store_sockets import LISTEN_FD_ENV, listening_socket
from trainflow.backends.torchrun_report import failed_ranks_with_evidence, log_tail, root_cause_exitcode
from trainflow.backends.worker import worker_config
from trainflow.home import runs_root
from trainflow.private_files import open_private, private_folder
from trainflow.runspec import RunSpec, SpecError


class ProvisionError(RuntimeError):
    """The resources the spec asks for are not available here."""


@register("local")
class LocalLauncher:
    name = "local"
    shares_scratch = True  # the orchestrator can reach every node's scratch (drills open their fault gate there)

    def preflight(self, spec: RunSpec) -> None:
        """This machine must hold the job: the nodes are this machine's processes."""
        problem = local_capacity_problem(spec.resources, oversubscribe=local_config(spec).oversubscribe)
        if problem:
            raise SpecError(problem)

    @staticmethod
    def head_start(spec, run_id: str):
        """Around `trainflow run`: the zygote of a warm run on the host's network starts before the
        flow does (warm_pools.head_start), or nothing."""
        config = local_config(spec)
        if not config.warm_workers or config.network != LocalNetwork.loopback:
            return nullcontext()
        stand_in = LocalAllocation(
            run_id=run_id, backend="local", nodes=spec.resources.nodes, scratch=Path(os.devnull), ports={}, slots=[]
        )
        return head_start(spec, agent_environment(spec, stand_in, 0, Path(os.devnull)), runs_root())

    def provision(self, spec, run_id: str, scratch: Path) -> LocalAllocation:
        self._check_capacity(spec)
        private_folder(scratch)  # worker configs (the status token), logs and node-local checkpoints
        allocation = LocalAllocation(
            run_id=run_id,
            backend=self.name,
            nodes=spec.resources.nodes,
            scratch=scratch,
            ports={"rendezvous": free_port(LOOPBACK)},
            slots=list(range(spec.resources.nodes)),
            temp_dir=create_job_temp_dir(scratch),
        )
        if local_config(spec).network == LocalNetwork.namespaces:
            if os.geteuid() != 0 or not shutil.which("ip"):
                raise ProvisionError("resources.network: namespaces needs root and iproute2 (`ip`)")
            network = NodeNetwork(run_id, spec.resources.nodes)
            try:
                network.create()
            except NetworkError as exc:
                raise ProvisionError(f"resources.network: {exc}") from None
            allocation.network = network
            allocation.status_host = network.host_address
        if local_config(spec).warm_workers:
            env = agent_environment(spec, allocation, 0, Path(os.devnull))
            allocation.warm_pools = start_pools(
                spec, allocation.slots, scratch, env, allocation.network.wrap if allocation.network else None
            )
        return allocation

    @staticmethod
    def _check_capacity(spec) -> None:
        # preflight refuses these first; flows may skip it
        problem = local_capacity_problem(spec.resources, oversubscribe=local_config(spec).oversubscribe)
        if problem:
            raise ProvisionError(problem)

    def launch(self, spec, allocation: LocalAllocation, plan: AttemptPlan) -> AttemptHandle:
        attempt_dir = allocation.scratch / f"attempt-{plan.attempt}"
        private_folder(attempt_dir)
        nodes = spec.resources.nodes
        handle = AttemptHandle(
            attempt=plan.attempt,
            nodes=nodes,
            started_at=time.time(),
            logs={},
            procs_per_node=spec.resources.procs_per_node,
        )
        handle.slots = allocation.slots[:nodes]
        # on the host's network the rendezvous port is bound (on loopback) before its number is handed
        # out, and node 0's agent serves the store on this very socket: no other process can take it
        listener = listening_socket(LOOPBACK) if allocation.network is None else None
        # in network namespaces node 0's agent binds it in its own network: a port new to each attempt,
        # so one taken there (an INFRA failure, retried) is not chosen again
        allocation.ports["rendezvous"] = listener.getsockname()[1] if listener is not None else free_port(LOOPBACK)
        with listener or nullcontext():
            self._start_agents(spec, allocation, plan, handle, attempt_dir, listener)
        allocation.sessions.extend(p.pid for p in handle.processes.values())
        return handle

    def _start_agents(
        self, spec, allocation: LocalAllocation, plan: AttemptPlan, handle: AttemptHandle, attempt_dir: Path, listener
    ) -> None:
        for node, slot in enumerate(handle.slots):
            node_scratch = private_folder(allocation.scratch / f"node-{slot}")
            config = worker_config(spec, allocation.run_id, plan, node, node_scratch)
            config_path = config.write(attempt_dir / f"node-{node}.json")
            log_path = attempt_dir / f"node-{node}.log"
            env = agent_environment(spec, allocation, node, config_path) | output_environment(spec, attempt_dir, node)
            env["TMPDIR"] = str(private_folder(allocation.temp_dir / f"node-{slot}"))
            handle.rank_records[node] = records_path(attempt_dir, node)
            env[RECORDS_ENV] = str(handle.rank_records[node])
            listen_fd = listener.fileno() if listener is not None and node == 0 else None
            if listen_fd is not None:
                env[LISTEN_FD_ENV] = str(listen_fd)
            pool = allocation.warm_pools.get(slot)
            with open(open_private(log_path, append=True), "ab") as log:
                warm = (
                    pool.start_agent(
                        torchrun_arguments(spec, allocation, plan, node, slot, attempt_dir),
                        env,
                        log.fileno(),
                        listen_fd,
                    )
                    if pool
                    else None
                )
                handle.warm_nodes += warm is not None
                handle.processes[node] = warm or subprocess.Popen(
                    ending_with_this_process(agent_command(spec, allocation, plan, node, slot, attempt_dir)),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(listen_fd,) if listen_fd is not None else (),
                )
            handle.logs[node] = log_path

    def poll(self, handle: AttemptHandle) -> list[NodeExit]:
        """Agents' exit codes, a worker that died noticed before its agent has reacted (the agent
        takes most of a second to notice, stop its other workers and exit), and a node whose workers
        all exited 0 while its agent waits for the other nodes."""
        exits = []
        for node, proc in sorted(handle.processes.items()):
            code = proc.poll()
            workers = node_workers(handle, node, proc) if code is None else []
            ended = read_exits(handle.rank_records[node]) if code is None else {}
            # a worker can start and end between two polls: the agent's record knows it all the same;
            # one with a process started in its place (rank_replacement.py) is not lost
            replaced = read_replaced(handle.rank_records[node]) if code is None else set()
            lost = any(c != 0 for c in ended.values()) or any(
                not alive(w) and ended.get(w.pid) != 0 and w.pid not in replaced for w in workers
            )
            finished = len(ended) == handle.procs_per_node and not any(ended.values())
            worker_code = root_cause_exitcode(handle.logs[node]) if code not in (None, 0) else None
            log_dir = torchrun_log_dir(handle.logs[node].parent, node)
            ranks = failed_ranks_with_evidence(handle.logs[node], log_dir) if code not in (None, 0) else ()
            tail = tuple(log_tail(handle.logs[node])) if code not in (None, 0) and not ranks else ()
            exits.append(
                NodeExit(
                    node,
                    code,
                    workers_lost=lost,
                    workers_finished=finished,
                    worker_returncode=worker_code,
                    ranks=ranks,
                    log_tail=tail,
                )
            )
        return exits

    def stop(self, handle: AttemptHandle, grace_s: float) -> int:
        """End every node's whole session: SIGTERM (torchrun forwards it) and SIGCONT (so frozen
        processes can act on it), then SIGKILL after the grace period."""
        running = [proc for proc in handle.processes.values() if proc.poll() is None]
        members = session_members([proc.pid for proc in handle.processes.values()])
        # torchrun starts each worker in a session of its own: one blocked where it cannot act on
        # SIGTERM (a call to a store that does not answer) would outlive its agent
        workers = [w for known in handle.workers.values() for w in known if w not in members]
        for proc in running:
            signal_session(proc.pid, signal.SIGTERM)
            signal_session(proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in running):
            time.sleep(0.05)
        for proc in handle.processes.values():
            signal_session(proc.pid, signal.SIGKILL)
            proc.wait()
        for worker in workers:
            try:
                worker.kill()  # psutil checks the pid still names this process
            except psutil.Error:
                pass
        psutil.wait_procs([m for m in members + workers if m.is_running()], timeout=5)
        return len(members) + len(workers)

    def probe(self, handle: AttemptHandle, node: int) -> str:
        return node_state(handle, node)

    def dump_stacks(self, handle: AttemptHandle, pids_by_rank: dict[int, int]) -> dict[int, str]:
        return rank_stacks(pids_by_rank)

    def rank_processes(self, handle: AttemptHandle, nodes: list[int]) -> dict[int, int]:
        """Global rank -> pid of the given nodes' ranks still running, as their agents started them."""
        found = {}
        for node in nodes:
            exited = read_exits(handle.rank_records[node])
            found.update(
                {rank: pid for rank, pid in read_ranks(handle.rank_records[node]).items() if pid not in exited}
            )
        return found

    def replace_node(self, allocation: LocalAllocation, slot: int) -> bool:
        """Bring a failed node slot back for the next attempt; False when it cannot come back."""
        if not allocation.lost.may_return(slot):
            return False
        if allocation.network is not None:
            try:
                allocation.network.restore(slot)
            except NetworkError:
                return False
        return True

    def signal_rank(self, allocation: Allocation, pid: int, sig: signal.Signals) -> None:
        os.kill(pid, sig)  # every rank is a process of this machine

    def replaced_pids(self, handle: AttemptHandle, node: int) -> set[int]:
        return read_replaced(handle.rank_records[node]) if node in handle.rank_records else set()

    def end_rank(self, handle: AttemptHandle, node: int, pid: int, reason: str, hang: bool) -> bool:
        note_ended(str(handle.rank_records[node]), pid, reason, hang)  # before its death: its agent reads it then
        try:
            os.kill(pid, signal.SIGKILL)  # a stopped process too
        except ProcessLookupError:
            return False
        return True

    def preempt_node(self, handle: AttemptHandle, node: int) -> None:
        handle.processes[node].send_signal(signal.SIGTERM)  # to the node's agent, which passes it on

    def cut_node(self, allocation: LocalAllocation, slot: int, permanent: bool, replaced_later: bool = False) -> str:
        return cut_node_link(
            allocation.network,
            allocation.lost,
            slot,
            permanent,
            replaced_later,
            without_links="node-loss needs resources.network: namespaces",
        )

    def release(self, allocation: LocalAllocation) -> ReleaseReport:
        report = ReleaseReport()
        for session in allocation.sessions:
            signal_session(session, signal.SIGCONT)
            signal_session(session, signal.SIGKILL)
        report.released_standbys = close_pools(allocation.warm_pools)
        leftovers = job_processes(allocation.run_id)
        report.stopped_processes = terminate(leftovers, grace_s=2.0) if leftovers else 0
        report.survivors = [describe(p) for p in wait_until_gone(allocation.run_id, timeout_s=5.0)]
        network = allocation.network
        if network is not None:
            report.survivors.extend(network.destroy())
            report.removed_paths.append(f"network namespaces of {network.bridge}")
        for name, port in allocation.ports.items():
            if not network and is_listening(port):
                report.survivors.append(f"port {port} ({name}) still listening")
            else:
                report.released_ports.append(port)
        temp_dir = allocation.temp_dir or job_temp_dir(allocation.scratch)
        report.removed_paths.extend(remove_recorded(allocation.scratch))  # what an agent killed outright left
        report.remove_folder(allocation.scratch)
        if temp_dir is not None:
            report.remove_folder(temp_dir)
        return report
