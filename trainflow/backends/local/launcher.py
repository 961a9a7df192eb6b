"""Local backend: N nodes x M processes on this machine, one torchrun agent per node.

Each node's agent starts in its own session with c10d rendezvous (node 0 hosts the store). By
default every node shares loopback; with `resources.network: namespaces` each node is a "host" in
its own network namespace with its own address, so a node can drop off the network. gloo on CPU,
nccl when the spec asks for GPUs (each node gets its own devices).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil

from trainflow.backends import register
from trainflow.backends.base import Allocation, AttemptHandle, AttemptPlan, NodeExit, RankExit, ReleaseReport
from trainflow.backends.netns import NetworkError, NodeNetwork
from trainflow.backends.parent_death import ending_with_this_process
from trainflow.backends.ports import free_port, is_listening
from trainflow.backends.processes import describe, job_processes, signal_session, terminate, wait_until_gone
from trainflow.backends.torchrun_report import failed_ranks, stderr_tail
from trainflow.backends.worker import secret_environment, worker_config
from trainflow.capacity import local_capacity_problem
from trainflow.private_files import open_private, private_folder
from trainflow.spec import RunSpec, SpecError
from trainflow.worker_config import CONFIG_ENV, JOB_ENV

LOOPBACK = "127.0.0.1"
PY_SPY = Path(sys.executable).parent / "py-spy"


def torchrun_log_dir(attempt_dir: Path, node: int) -> Path:
    """Where a node's agent keeps its ranks' stderr files and error files."""
    return attempt_dir / "torchrun" / f"node-{node}"


ROOT_CAUSE_EXITCODE = re.compile(r"Root Cause.*?exitcode\s*:\s*(-?\d+)", re.S)


def root_cause_exitcode(log: Path) -> int | None:
    """The failed worker's exit code from torchrun's failure report in the node's log."""
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, log.stat().st_size - 64_000))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return None
    found = ROOT_CAUSE_EXITCODE.findall(tail)
    return int(found[-1]) if found else None


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ProvisionError(RuntimeError):
    """The resources the spec asks for are not available here."""


@register("local")
class LocalLauncher:
    name = "local"
    shares_scratch = True  # the orchestrator can reach every node's scratch (drills open their fault gate there)

    def preflight(self, spec: RunSpec) -> None:
        """This machine must hold the job: the nodes are this machine's processes."""
        problem = local_capacity_problem(spec.resources)
        if problem:
            raise SpecError(problem)

    def provision(self, spec, run_id: str, scratch: Path) -> Allocation:
        self._check_capacity(spec)
        private_folder(scratch)  # worker configs (the status token), logs and node-local checkpoints
        allocation = Allocation(
            run_id=run_id,
            backend=self.name,
            nodes=spec.resources.nodes,
            scratch=scratch,
            ports={"rendezvous": free_port(LOOPBACK)},
            slots=list(range(spec.resources.nodes)),
        )
        if spec.resources.network.value == "namespaces":
            if os.geteuid() != 0 or not shutil.which("ip"):
                raise ProvisionError("resources.network: namespaces needs root and iproute2 (`ip`)")
            network = NodeNetwork(run_id, spec.resources.nodes)
            try:
                network.create()
            except NetworkError as exc:
                raise ProvisionError(f"resources.network: {exc}") from None
            allocation.details["network"] = network
            allocation.status_host = network.host_address
        return allocation

    @staticmethod
    def _check_capacity(spec) -> None:
        problem = local_capacity_problem(spec.resources)  # preflight refuses these first; flows may skip it
        if problem:
            raise ProvisionError(problem)

    def launch(self, spec, allocation: Allocation, plan: AttemptPlan) -> AttemptHandle:
        attempt_dir = allocation.scratch / f"attempt-{plan.attempt}"
        private_folder(attempt_dir)
        nodes = spec.resources.nodes
        handle = AttemptHandle(attempt=plan.attempt, nodes=nodes, started_at=time.time(), logs={},
                               procs_per_node=spec.resources.procs_per_node)
        handle.slots = allocation.slots[:nodes]
        for node, slot in enumerate(handle.slots):
            node_scratch = private_folder(allocation.scratch / f"node-{slot}")
            config = worker_config(spec, allocation.run_id, plan, node, node_scratch)
            config_path = config.write(attempt_dir / f"node-{node}.json")
            log_path = attempt_dir / f"node-{node}.log"
            with open(open_private(log_path, append=True), "ab") as log:
                handle.processes[node] = subprocess.Popen(
                    ending_with_this_process(self._command(spec, allocation, plan, node, slot, attempt_dir)),
                    env=self._environment(spec, allocation, node, config_path),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            handle.logs[node] = log_path
        allocation.details.setdefault("sessions", []).extend(p.pid for p in handle.processes.values())
        return handle

    def poll(self, handle: AttemptHandle) -> list[NodeExit]:
        """Agents' exit codes, and a dead worker noticed before its agent has reacted (the agent
        takes most of a second to notice, stop its other workers and exit)."""
        exits = []
        for node, proc in sorted(handle.processes.items()):
            code = proc.poll()
            lost = code is None and any(not _alive(w) for w in self._workers(handle, node, proc.pid))
            worker_code = root_cause_exitcode(handle.logs[node]) if code not in (None, 0) else None
            ranks = self._failed_ranks(handle, node) if code not in (None, 0) else ()
            exits.append(NodeExit(node, code, workers_lost=lost, worker_returncode=worker_code, ranks=ranks))
        return exits

    @staticmethod
    def _failed_ranks(handle: AttemptHandle, node: int) -> tuple[RankExit, ...]:
        """The agent's own account of each failed rank, with that rank's last stderr lines."""
        log_dir = torchrun_log_dir(handle.logs[node].parent, node)
        return tuple(
            replace(failed, stderr_tail=tuple(stderr_tail(log_dir, failed.local_rank)))
            for failed in failed_ranks(handle.logs[node])
        )

    @staticmethod
    def _workers(handle: AttemptHandle, node: int, agent_pid: int) -> list[psutil.Process]:
        known = handle.workers.get(node, [])
        if len(known) < handle.procs_per_node:
            try:
                known = [c for c in psutil.Process(agent_pid).children() if _alive(c)]
            except psutil.Error:
                known = []
            handle.workers[node] = known
        return known if len(known) == handle.procs_per_node else []

    def stop(self, handle: AttemptHandle, grace_s: float) -> int:
        """End every node's whole session: SIGTERM (torchrun forwards it) and SIGCONT (so frozen
        processes can act on it), then SIGKILL after the grace period."""
        running = [proc for proc in handle.processes.values() if proc.poll() is None]
        members = self._session_members([proc.pid for proc in handle.processes.values()])
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
        """How a silent node looks from this machine: its processes stopped, running, or gone."""
        agent = handle.processes.get(node)
        if agent is None or agent.poll() is not None:
            return "gone"
        try:
            leader = psutil.Process(agent.pid)
            workers = leader.children(recursive=True)
            if leader.status() == psutil.STATUS_STOPPED:
                return "node-stopped"
            if any(w.status() == psutil.STATUS_STOPPED for w in workers):
                return "workers-stopped"
        except psutil.Error:
            return "gone"
        return "running"

    def dump_stacks(self, handle: AttemptHandle, pids_by_rank: dict[int, int]) -> dict[int, str]:
        """Every rank's Python stacks, read from outside with py-spy (works on frozen processes)."""
        stacks = {}
        for rank, pid in sorted(pids_by_rank.items()):
            if not PY_SPY.exists():
                stacks[rank] = "py-spy is not installed"
                continue
            try:
                result = subprocess.run(
                    [str(PY_SPY), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20
                )
                stacks[rank] = (result.stdout or result.stderr).strip()[-20000:]
            except subprocess.TimeoutExpired:
                stacks[rank] = "py-spy dump timed out"
        return stacks

    def replace_node(self, allocation: Allocation, slot: int) -> bool:
        """Bring a failed node slot back for the next attempt; False when it cannot come back."""
        if slot in allocation.details.get("unrecoverable", set()):
            return False
        network: NodeNetwork | None = allocation.details.get("network")
        if network is not None:
            try:
                network.restore(slot)
            except NetworkError:
                return False
        return True

    def release(self, allocation: Allocation) -> ReleaseReport:
        report = ReleaseReport()
        for session in allocation.details.get("sessions", []):
            signal_session(session, signal.SIGCONT)
            signal_session(session, signal.SIGKILL)
        leftovers = job_processes(allocation.run_id)
        report.stopped_processes = terminate(leftovers, grace_s=2.0) if leftovers else 0
        report.survivors = [describe(p) for p in wait_until_gone(allocation.run_id, timeout_s=5.0)]
        network: NodeNetwork | None = allocation.details.get("network")
        if network is not None:
            report.survivors.extend(network.destroy())
            report.removed_paths.append(f"network namespaces of {network.bridge}")
        for name, port in allocation.ports.items():
            if not network and is_listening(port):
                report.survivors.append(f"port {port} ({name}) still listening")
            else:
                report.released_ports.append(port)
        report.remove_folder(allocation.scratch)
        return report

    @staticmethod
    def _session_members(sessions: list[int]) -> list[psutil.Process]:
        members = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) in sessions:
                    members.append(proc)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        return members

    @staticmethod
    def _command(spec, allocation: Allocation, plan: AttemptPlan, node: int, slot: int, attempt_dir: Path) -> list[str]:
        network: NodeNetwork | None = allocation.details.get("network")
        store_host = network.node_address(allocation.slots[0]) if network else LOOPBACK
        own_address = network.node_address(slot) if network else LOOPBACK
        command = [
            sys.executable, "-m", "trainflow.backends.agent",
            "--nnodes", str(spec.resources.nodes),
            "--nproc-per-node", str(spec.resources.procs_per_node),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{store_host}:{allocation.ports['rendezvous']}",
            "--rdzv-id", f"{allocation.run_id}-{plan.attempt}",
            "--rdzv-conf", f"is_host={'true' if node == 0 else 'false'}",
            "--max-restarts", "0",
            "--monitor-interval", "0.1",
            "--local-addr", own_address,
            "--log-dir", str(torchrun_log_dir(attempt_dir, node)),
            # each rank's stderr also in a file of its own, so a failure can quote the rank's last lines
            "--redirects", "2", "--tee", "2",
            spec.workload.entrypoint, *spec.workload.args,
        ]
        return network.wrap(command, slot) if network else command

    @staticmethod
    def _environment(spec, allocation: Allocation, node: int, config_path: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(secret_environment(spec))  # explicitly, whatever else of this environment is passed on
        env.update(
            {
                CONFIG_ENV: str(config_path),
                JOB_ENV: allocation.run_id,
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": str(max(1, int(spec.resources.cpu // spec.resources.procs_per_node))),
            }
        )
        # the communication library's own account of each attempt lands in the node logs
        env.setdefault("TORCH_CPP_LOG_LEVEL", "INFO")
        if spec.comm_backend() == "nccl":
            env.setdefault("NCCL_DEBUG", "INFO")
        if allocation.details.get("network") is not None:
            env["GLOO_SOCKET_IFNAME"] = "eth0"
        if spec.resources.gpu:
            first = node * spec.resources.gpu
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(spec.resources.gpu))
        return env
