"""`make bench`'s real jobs of 32 and 64 ranks on this machine (4 and 8 local nodes x 8 ranks of the
reference workload with a tiny model, `resources.oversubscribe: true`), next to the 2-rank reference
job measured in the same run: start-up, training throughput, a crash drill's detection, recovery and
exact resume, and the memory of the job's processes with warm workers. Before them, one node of 8
ranks with warm workers and with new interpreters, to say what a node costs.

Every process of a job carries TRAINFLOW_JOB in its environment (a forked one: in the environment it
was started with); a sampler reads their PSS (each shared page split between the processes sharing
it, so the sums add up) once a second while the job trains; of the samples with every rank up it
keeps the median (training) and the largest (a checkpoint's save on top). Roles by the process tree:
torchrun's agent names itself pt_elastic, a zygote is a process with the job's processes below it
(or none above), every other one is a rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import psutil
from bench_common import BIN, ROOT, last_json, steps_per_s

SPEC = "examples/digits/spec.yaml"
TINY = ["--set", 'workload.args=["--hidden","16"]', "--set", "resources.oversubscribe=true"]
STEPS, EVERY, FAULT_AT = 60, 10, 30
JOBS = [(2, 1), (4, 8), (8, 8)]  # (nodes, ranks per node); the first is the reference job's shape
NODE, NODE_STEPS = (1, 8), 1000  # the node whose memory docs/warm-workers.md quotes


def shape(nodes: int, per_node: int) -> list[str]:
    return ["--set", f"resources.nodes={nodes}", "--set", f"resources.procs_per_node={per_node}"]


class MemorySampler:
    """The PSS of a job's processes (those whose TRAINFLOW_HOME is `home` and that carry TRAINFLOW_JOB),
    by role, and the orchestrator's (`orchestrator_pid`), sampled every `every_s` seconds."""

    def __init__(self, home: str, ranks: int, every_s: float = 1.0):
        self.home, self.ranks, self.every_s = home, ranks, every_s
        self.samples: list[dict] = []
        self.orchestrator_mb = 0.0
        self.orchestrator_pid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            sample = self.sample()
            if sample and sample["ranks"]["count"] == self.ranks:
                self.samples.append(sample)

    def median(self) -> dict | None:
        ordered = sorted(self.samples, key=lambda sample: sample["total_mb"])
        return ordered[len(ordered) // 2] if ordered else None

    def peak(self) -> dict | None:
        return max(self.samples, key=lambda sample: sample["total_mb"], default=None)

    def sample(self) -> dict | None:
        job: dict[int, psutil.Process] = {}
        for process in psutil.process_iter():
            try:
                environment = process.environ()
                if environment.get("TRAINFLOW_HOME") == self.home and "TRAINFLOW_JOB" in environment:
                    job[process.pid] = process
            except psutil.Error:
                continue
        if self.orchestrator_pid:
            try:
                rss = psutil.Process(self.orchestrator_pid).memory_info().rss / 2**20
                self.orchestrator_mb = max(self.orchestrator_mb, rss)
            except psutil.Error:
                pass
        roles: dict[str, list[tuple[float, float]]] = {"zygotes": [], "agents": [], "ranks": []}
        parents = {}
        for pid, process in job.items():
            try:
                parents[pid] = process.ppid()
            except psutil.Error:
                continue
        for pid, process in job.items():
            try:
                memory = process.memory_full_info()
                name = process.name()
            except psutil.Error:
                continue
            has_children = any(parent == pid for parent in parents.values())
            role = (
                "agents"
                if name == "pt_elastic"
                else "zygotes"
                if has_children or parents.get(pid) not in job
                else "ranks"
            )
            roles[role].append((memory.pss / 2**20, memory.uss / 2**20))
        if not roles["ranks"]:
            return None
        summary = {
            role: {
                "count": len(values),
                "pss_mb": round(sum(p for p, _ in values), 1),
                "uss_mb": round(sum(u for _, u in values), 1),
            }
            for role, values in roles.items()
        }
        summary["total_mb"] = round(sum(part["pss_mb"] for part in summary.values()), 1)
        return summary


def run_job(env: dict, nodes: int, per_node: int, extra: list[str] = (), steps: int = STEPS) -> dict:
    """A fault-free run: start-up (the command's start, and the attempt's launch, to the first step),
    steps/s after the first 10 steps, and the memory of its processes."""
    from mlflow.tracking import MlflowClient

    args = [
        "run",
        SPEC,
        *shape(nodes, per_node),
        *TINY,
        "--set",
        f"workload.steps={steps}",
        "--set",
        f"checkpoint.every_steps={EVERY}",
        *extra,
        "--json",
    ]
    with MemorySampler(env["TRAINFLOW_HOME"], nodes * per_node) as sampler:
        launched = time.time()
        proc = subprocess.Popen(
            [str(BIN / "trainflow"), *args],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        sampler.orchestrator_pid = proc.pid
        stdout, stderr = proc.communicate(timeout=1800)
        wall_s = time.time() - launched
    lines = stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"trainflow run printed nothing:\n{stderr[-3000:]}")
    summary = json.loads(lines[-1])
    if summary.get("status") != "succeeded":
        raise RuntimeError(f"the {nodes} x {per_node} run {summary.get('status')}: {summary.get('reason')}")
    history = MlflowClient(summary["tracking_uri"]).get_metric_history(summary["mlflow_run_id"], "loss")
    points = [(m.step, m.timestamp / 1000) for m in history]
    first = min(t for _, t in points)
    return {
        "steps_per_s": round(steps_per_s(points, skip=10), 3),
        "startup_s": round(first - launched, 2),
        "launch_to_first_step_s": round(first - summary["attempts"][0]["started_at"], 2),
        "wall_s": round(wall_s, 1),
        "memory": sampler.median(),
        "memory_peak": sampler.peak(),
        "memory_samples": len(sampler.samples),
        "orchestrator_rss_mb": round(sampler.orchestrator_mb),
    }


def crash_drill(env: dict, nodes: int, per_node: int) -> dict:
    report = last_json(
        [
            "drill",
            SPEC,
            "--fault",
            "crash",
            "--at-step",
            str(FAULT_AT),
            "--no-compare-torchrun",
            *shape(nodes, per_node),
            *TINY,
            "--set",
            f"workload.steps={STEPS}",
            "--set",
            f"checkpoint.every_steps={EVERY}",
            "--json",
        ],
        env,
        timeout_s=1800,
    )
    return {
        k: report.get(k)
        for k in (
            "outcomes",
            "detection_latency_s",
            "recovery_s",
            "recovery_phases",
            "lost_steps",
            "resumed_from_step",
            "params_match_baseline",
            "resources_released",
            "passed",
        )
    }


def scale_jobs(env: dict) -> dict:
    # long enough for tens of samples while the node trains
    node = {
        "warm": run_job(env, *NODE, steps=NODE_STEPS),
        "cold": run_job(env, *NODE, ["--set", "resources.warm_workers=false"], steps=NODE_STEPS),
    }
    jobs = {}
    for nodes, per_node in JOBS:
        load_before = os.getloadavg()
        jobs[str(nodes * per_node)] = {
            "nodes": nodes,
            "per_node": per_node,
            "run": run_job(env, nodes, per_node),
            "crash": crash_drill(env, nodes, per_node),
            "load_before": load_before,
        }
    return {"node": node, "jobs": jobs}


def node_cost(memory: dict) -> float:
    """PSS of one node of 8 ranks: its zygote's, its agent's and its ranks'."""
    return memory["total_mb"] / max(memory["agents"]["count"], 1)


def markdown(part: dict) -> list[str]:
    node, jobs = part["node"], part["jobs"]
    lines = [
        "## Real jobs of 32 and 64 ranks",
        "",
        "4 and 8 local nodes x 8 ranks, `resources.oversubscribe: true`, the reference workload with 16 hidden "
        f"units; {STEPS} steps, a checkpoint every {EVERY}, a crash drill at step {FAULT_AT} "
        "(`bench/scale_jobs.py`). "
        f"Measured {part['measured_at']} on the shared 2-core machine (other work beside it) with the status "
        "channel of this version (a thread per connection); the 1-minute load average before each job: "
        + ", ".join(f"{ranks} ranks {job['load_before'][0]:.0f}" for ranks, job in jobs.items())
        + ". The 2-rank row is the reference job's shape measured in the same run.",
        "",
        "| ranks | start-up to first step (s) | launch to first step (s) | steps/s | crash detected (s) | "
        "recovery (s) | stop / rendezvous / restore (s) | lost steps | exact resume | memory PSS (MB): training, "
        "per rank, peak | "
        "orchestrator RSS (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ranks, job in jobs.items():
        run, crash = job["run"], job["crash"]
        phases = crash.get("recovery_phases") or {}
        memory = run["memory"] or {"total_mb": 0}
        peak = run.get("memory_peak") or memory
        lines.append(
            f"| {ranks} | {run['startup_s']:.1f} | {run['launch_to_first_step_s']:.1f} | {run['steps_per_s']:.2f} | "
            f"{crash['detection_latency_s']} | {crash['recovery_s']} | "
            f"{phases.get('stop', 0):.1f} / {phases.get('rendezvous', 0):.1f} / {phases.get('restore', 0):.1f} | "
            f"{crash['lost_steps']} | {crash['params_match_baseline']} | "
            f"{memory['total_mb']:.0f}, {memory['total_mb'] / int(ranks):.0f}, {peak['total_mb']:.0f} | "
            f"{run['orchestrator_rss_mb']} |"
        )
    lines += [
        "",
        "Every rank shares the same 2 cores, so a step of 64 ranks is 64 gloo all-reduces' worth of "
        "the machine: the figures say that such a job runs, fails and resumes exactly here, not how fast a "
        "cluster would run it. Recovery is mostly stopping the failed attempt's processes, the new "
        "attempt's rendezvous and every rank's restore, all of which wait on CPU time shared by every rank. "
        "The crash is seen at once (the launcher watches every rank's process); the verdict then waits for "
        "the failed node's torchrun agent to stop its other ranks and exit with its failure report, and "
        "that wait, with every other rank's exit, is the stop phase. The orchestrator's memory does not "
        "grow with the ranks.",
        "",
        f"### One node of 8 ranks ({NODE[0]} node x {NODE[1]}, {NODE_STEPS} steps), memory",
        "",
        "| | zygote | agent | 8 ranks | node total while training | per rank (of it private) | node peak "
        "(a checkpoint's save) | launch to first step (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in (("warm workers", node["warm"]), ("new interpreters", node["cold"])):
        memory, peak = run["memory"], run.get("memory_peak") or run["memory"]
        if not memory:
            continue
        ranks = memory["ranks"]
        lines.append(
            f"| {name} | {memory['zygotes']['pss_mb']:.0f} | {memory['agents']['pss_mb']:.0f} | "
            f"{ranks['pss_mb']:.0f} | {node_cost(memory):.0f} | "
            f"{ranks['pss_mb'] / ranks['count']:.0f} ({ranks['uss_mb'] / ranks['count']:.0f}) | "
            f"{node_cost(peak):.0f} | {run['launch_to_first_step_s']:.1f} |"
        )
    lines += [
        "",
        "Memory is PSS in MB (each shared page split between the processes that share it, so the "
        "figures add up), the median of one sample a second while every rank trains; private is USS, what "
        "the rank alone holds. A forked rank shares its zygote's imports until it writes to them. In the "
        "jobs above a node of 8 ranks holds the same: its total divided by its nodes.",
        "",
    ]
    return lines


if __name__ == "__main__":
    raise SystemExit("run it as a part of make bench: python bench/run_benchmarks.py --only scale_jobs")
