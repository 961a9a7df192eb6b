"""Local backend: N nodes x M processes on this machine, one torchrun agent per node.

Each node's agent starts in its own session with c10d rendezvous on loopback; node 0 hosts the
rendezvous store. gloo on CPU, nccl when the spec asks for GPUs (each node gets its own devices).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from trainflow.backends import register
from trainflow.backends.base import Allocation, AttemptHandle, AttemptPlan, NodeExit, ReleaseReport
from trainflow.backends.ports import free_port, is_listening
from trainflow.backends.processes import describe, job_processes, signal_session, terminate, wait_until_gone
from trainflow.backends.worker import worker_config
from trainflow.worker_config import CONFIG_ENV, JOB_ENV

LOOPBACK = "127.0.0.1"


class ProvisionError(RuntimeError):
    """The resources the spec asks for are not available here."""


@register("local")
class LocalLauncher:
    name = "local"

    def provision(self, spec, run_id: str, scratch: Path) -> Allocation:
        if spec.resources.gpu:
            import torch

            needed = spec.resources.nodes * spec.resources.gpu
            if torch.cuda.device_count() < needed:
                raise ProvisionError(
                    f"resources: {needed} GPUs requested, {torch.cuda.device_count()} visible on this machine"
                )
        if spec.resources.cpu * spec.resources.nodes > 4 * (os.cpu_count() or 1):
            raise ProvisionError(
                f"resources.cpu: {spec.resources.cpu} x {spec.resources.nodes} nodes oversubscribes "
                f"this machine's {os.cpu_count()} cores more than fourfold"
            )
        scratch.mkdir(parents=True, exist_ok=True)
        return Allocation(
            run_id=run_id,
            backend=self.name,
            nodes=spec.resources.nodes,
            scratch=scratch,
            ports={"rendezvous": free_port(LOOPBACK)},
        )

    def launch(self, spec, allocation: Allocation, plan: AttemptPlan) -> AttemptHandle:
        attempt_dir = allocation.scratch / f"attempt-{plan.attempt}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        handle = AttemptHandle(attempt=plan.attempt, nodes=allocation.nodes, started_at=time.time(), logs={})
        for node in range(allocation.nodes):
            node_scratch = allocation.scratch / f"node-{node}"
            config = worker_config(spec, allocation.run_id, plan, node, node_scratch)
            config_path = config.write(attempt_dir / f"node-{node}.json")
            log_path = attempt_dir / f"node-{node}.log"
            with open(log_path, "ab") as log:
                handle.processes[node] = subprocess.Popen(
                    self._command(spec, allocation, plan, node),
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
        return [NodeExit(node, proc.poll()) for node, proc in sorted(handle.processes.items())]

    def stop(self, handle: AttemptHandle, grace_s: float) -> int:
        """End every node's whole session: SIGTERM (torchrun forwards it), then SIGKILL."""
        running = [proc for proc in handle.processes.values() if proc.poll() is None]
        members = self._session_members([proc.pid for proc in handle.processes.values()])
        for proc in running:
            signal_session(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in running):
            time.sleep(0.05)
        for proc in handle.processes.values():
            signal_session(proc.pid, signal.SIGKILL)
            proc.wait()
        psutil.wait_procs([m for m in members if m.is_running()], timeout=5)
        return len(members)

    def release(self, allocation: Allocation) -> ReleaseReport:
        report = ReleaseReport()
        for session in allocation.details.get("sessions", []):
            signal_session(session, signal.SIGKILL)
        leftovers = job_processes(allocation.run_id)
        report.stopped_processes = terminate(leftovers, grace_s=2.0) if leftovers else 0
        report.survivors = [describe(p) for p in wait_until_gone(allocation.run_id, timeout_s=5.0)]
        for name, port in allocation.ports.items():
            if is_listening(port):
                report.survivors.append(f"port {port} ({name}) still listening")
            else:
                report.released_ports.append(port)
        if allocation.scratch.exists():
            shutil.rmtree(allocation.scratch, ignore_errors=True)
            report.removed_paths.append(str(allocation.scratch))
        if allocation.scratch.exists():
            report.survivors.append(f"{allocation.scratch} could not be removed")
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
    def _command(spec, allocation: Allocation, plan: AttemptPlan, node: int) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(allocation.nodes),
            "--nproc-per-node", str(spec.resources.procs_per_node),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{LOOPBACK}:{allocation.ports['rendezvous']}",
            "--rdzv-id", f"{allocation.run_id}-{plan.attempt}",
            "--rdzv-conf", f"is_host={'true' if node == 0 else 'false'}",
            "--max-restarts", "0",
            "--monitor-interval", "0.1",
            "--local-addr", LOOPBACK,
            spec.workload.entrypoint, *spec.workload.args,
        ]

    @staticmethod
    def _environment(spec, allocation: Allocation, node: int, config_path: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                CONFIG_ENV: str(config_path),
                JOB_ENV: allocation.run_id,
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": str(max(1, int(spec.resources.cpu // spec.resources.procs_per_node))),
            }
        )
        if spec.resources.gpu:
            first = node * spec.resources.gpu
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(spec.resources.gpu))
        return env
