"""`make bench`: trainflow measured against the plain alternative, side by side in one run on this
machine. Writes bench/results.json and BENCHMARKS.md; every figure in them comes from here.

- orchestration tax: the reference workload's training throughput under trainflow / under bare
  torchrun, and the start-up time until the first step of each
- drills: detection latency and recovery time per fault kind, next to torchrun's own restart
- checkpoints: `trainflow bench checkpoint` (stalls, tier throughput against raw boto3)
- goodput on the reference drill: ~3 minutes of ~50-100 ms steps with three faults (bench/reference_goodput.py)
- soak: >= 30 faults of every kind with the CPU loaded (bench/soak_bench.py)
- the FSDP2 + TP example's orchestration tax (bench/fsdp_tp_tax.py)
- real jobs of 32 and 64 ranks: start-up, throughput, a crash's recovery, exact resume, memory (bench/scale_jobs.py)
- in-process restart's round at 1,024 to 16,384 ranks against a real store (bench/in_place_round.py)
- recovery against the state's size, in memory and by storage (bench/checkpoint_size.py)

    python bench/run_benchmarks.py                      # every part
    python bench/run_benchmarks.py --only soak,fsdp_tp  # these parts; the others' figures are kept
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import checkpoint_size  # bench/, beside this script
import ddp_layout
import fsdp_tp_tax
import in_place_round
import reference_goodput
import scale_bench
import scale_jobs
import soak_bench
from bench_common import BIN, ROOT, last_json, steps_per_s
from benchmarks_md import FIRST_PARTS, PARTS, ROUNDS, STEPS, render

from trainflow.backends.ports import free_port
from trainflow.drills.bench.checkpoint import SERVER_NICENESS
from trainflow.drills.servers import ServerError, stop_server, wait_http

SPEC = "examples/digits/spec.yaml"
EXTRA: list[str] = []  # extra --set overrides for the throughput run
DRILLS = [
    "exception",
    "crash",
    "kill",
    "hang",
    "preempt",
    "node-loss",
    "straggler",
    "corrupt-checkpoint",
    "storage-outage",
]
# the same faults with in-process restart, recovered within the attempt from the ranks' memory copies
# (a dead or frozen rank's process replaced by one that takes its copies over)
IN_PLACE = {f"{kind}-in-place": kind for kind in ("exception", "crash", "kill", "hang")}
IN_PLACE_FLAGS = ["--set", "fault_tolerance.in_process_restart=true"]
# a node lost for good (the job shrinks, resuming from buddy copies), then its replacement (it grows back)
GROW_BACK = "node-loss-replaced-later"
# 400 steps: the shrunken attempt must outlast the checkpoint commit that asks for the node back
# (at ~2 ms steps the 50 steps after a fault at step 30 of 80 end before its snapshot is read)
GROW_BACK_FLAGS = ["--permanent", "--replaced-later", "--set", "resources.min_nodes=1", "--set", "workload.steps=400"]
DRILL_JOB = [
    "--set",
    "workload.steps=80",
    "--set",
    "checkpoint.every_steps=10",
    "--set",
    "fault_tolerance.heartbeat_timeout_s=5",
    "--no-compare-torchrun",
]


def start(cmd: list[str], env: dict, health: str, log: Path, niceness: int = 0) -> subprocess.Popen:
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=(lambda: os.nice(niceness)) if niceness else None,
    )
    try:
        wait_http(health, proc, timeout_s=120, log=log)
    except ServerError:
        stop_server(proc)
        raise
    return proc


def bare_torchrun(home: Path) -> dict:
    out = home / "bare.json"
    launched = time.time()
    subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(home / "torchrun"),
            "bench/bare_digits.py",
            "--steps",
            str(STEPS),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "BENCH_LAUNCHED_AT": str(launched)},
        check=True,
        capture_output=True,
        timeout=600,
    )
    timings = json.loads(out.read_text())
    points = list(enumerate(timings["stamps"], start=1))
    return {"steps_per_s": steps_per_s(points), "startup_s": timings["stamps"][0] - launched}


def under_trainflow(env: dict, overrides: list[str] = ()) -> dict:
    from mlflow.tracking import MlflowClient

    launched = time.time()
    summary = last_json(["run", SPEC, "--set", f"workload.steps={STEPS}", *EXTRA, *overrides, "--json"], env)
    client = MlflowClient(summary["tracking_uri"])
    history = client.get_metric_history(summary["mlflow_run_id"], "loss")
    points = [(m.step, m.timestamp / 1000) for m in history]
    figures = {
        "steps_per_s": steps_per_s(points),
        "startup_s": min(t for _, t in points) - launched,
        "goodput": summary["goodput"],
        "checkpoint_share": summary["costs"]["checkpoint_share"],
    }
    copies = [m.value for m in client.get_metric_history(summary["mlflow_run_id"], "memory_copy_s")]
    every = client.get_metric_history(summary["mlflow_run_id"], "memory_copy_every_steps")
    if copies and every:  # in-process restart's memory copies: what they cost against the step time
        figures["memory_copy_s"] = statistics.median(copies)
        figures["memory_copy_every_steps"] = every[-1].value
        figures["memory_copy_share"] = figures["memory_copy_s"] / (
            figures["memory_copy_every_steps"] * summary["costs"]["mean_step_time_s"]
        )
    return figures


def orchestration(home: Path, env: dict) -> dict:
    """Bare torchrun and trainflow in turn, ROUNDS times, so that the machine's drift hits both alike;
    each figure is the median of its rounds. Under trainflow first the orchestration alone
    (heartbeats, progress, control points; one checkpoint at the end), then with the reference
    spec's checkpoint interval on top, whose cost the checkpoint figures break down."""
    runs: dict[str, list[dict]] = {
        "bare": [],
        "trainflow": [],
        "trainflow_with_checkpoints": [],
        "trainflow_with_memory_copies": [],
    }
    last_only = ["--set", f"checkpoint.every_steps={STEPS}"]
    for _ in range(ROUNDS):
        runs["bare"].append(bare_torchrun(home))
        runs["trainflow"].append(under_trainflow(env, last_only))
        runs["trainflow_with_checkpoints"].append(under_trainflow(env))
        # in-process restart's in-memory copies at their default cadence, nothing else changed
        runs["trainflow_with_memory_copies"].append(under_trainflow(env, [*last_only, *IN_PLACE_FLAGS]))
    return summarize_orchestration(runs)


def summarize_orchestration(runs: dict[str, list[dict]]) -> dict:
    """Medians of each kind of run, and the throughput ratio as the median of the rounds' ratios: a
    round's runs follow each other, so its ratio is the least touched by the machine's drift."""
    figures = {
        kind: {key: statistics.median(run[key] for run in rounds) for key in rounds[0]} for kind, rounds in runs.items()
    }

    def ratios(kind: str) -> list[float]:
        return [round(ours["steps_per_s"] / plain["steps_per_s"], 4) for plain, ours in zip(runs["bare"], runs[kind])]

    copies = [
        round(ours["steps_per_s"] / plain["steps_per_s"], 4)
        for plain, ours in zip(runs["trainflow"], runs["trainflow_with_memory_copies"])
    ]
    return {
        **figures,
        "rounds": runs,
        "memory_copies_ratio": statistics.median(copies),  # against trainflow without them
        "memory_copies_ratio_per_round": copies,
        "throughput_ratio": statistics.median(ratios("trainflow")),
        "throughput_ratio_with_checkpoints": statistics.median(ratios("trainflow_with_checkpoints")),
        "throughput_ratio_per_round": ratios("trainflow"),
        "throughput_ratio_with_checkpoints_per_round": ratios("trainflow_with_checkpoints"),
        "throughput_ratio_with_memory_copies": statistics.median(ratios("trainflow_with_memory_copies")),
    }


def drills(env: dict) -> dict:
    reports = {}
    for kind in [*DRILLS, *IN_PLACE, GROW_BACK]:
        extra = {
            # training must outlast the outage: at ~2 ms steps, 80 steps end inside it and the last
            # step's commit fails with the store (INFRA), where the drill expects it ridden through
            "storage-outage": [
                "--set",
                f"checkpoint.uri=s3://{env['BENCH_BUCKET']}/drill",
                "--duration",
                "5",
                "--set",
                "workload.steps=4000",
                "--set",
                "checkpoint.every_steps=200",
            ],
            # a straggler needs steps left to straggle through after the injection starts
            "straggler": ["--set", "workload.steps=600", "--set", "checkpoint.every_steps=100", "--duration", "6"],
            GROW_BACK: GROW_BACK_FLAGS,
            **dict.fromkeys(IN_PLACE, IN_PLACE_FLAGS),
        }.get(kind, [])
        fault = {GROW_BACK: "node-loss", **IN_PLACE}.get(kind, kind)
        try:
            report = last_json(["drill", SPEC, "--fault", fault, "--at-step", "30", *DRILL_JOB, *extra, "--json"], env)
        except (RuntimeError, subprocess.SubprocessError, ValueError) as exc:
            reports[kind] = {"error": str(exc)[-500:]}
            continue
        reports[kind] = {
            k: report[k]
            for k in (
                "detected_kind",
                "detection_latency_s",
                "recovery_s",
                "lost_steps",
                "resumed_from_step",
                "params_match_baseline",
                "resources_released",
                "injected_at_step",
                "detected_at_step",
                "goodput",
                "passed",
                "outcomes",
                "recovery_phases",
                "world_sizes",
                "resize_lost_steps",
                "resize_recovery_s",
                "ranks_kept",
                "ranks_replaced",
                "memory_copy_every_steps",
            )
            if k in report
        }
    return reports


def checkpoint_bench(env: dict) -> dict:
    try:
        return last_json(["bench", "checkpoint", "--json"], env)
    except (RuntimeError, subprocess.SubprocessError, ValueError) as exc:
        return {"error": str(exc)[-500:]}


def chosen_parts(argv: list[str]) -> list[str]:
    if not argv:
        return list(PARTS)
    if len(argv) != 2 or argv[0] != "--only":
        raise SystemExit(f"usage: run_benchmarks.py [--only PART,...]  (parts: {', '.join(PARTS)})")
    parts = [p.strip() for p in argv[1].split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise SystemExit(f"--only: unknown part(s) {', '.join(unknown) or '(none given)'}; parts: {', '.join(PARTS)}")
    return parts


RESULTS = ROOT / "bench" / "results.json"


def write(results: dict) -> None:
    RESULTS.write_text(json.dumps(results, indent=1, default=str))
    (ROOT / "BENCHMARKS.md").write_text(render(results))


def main(parts: list[str]) -> None:
    from trainflow.drills.bench.torchrun_restart import measure_torchrun_restart
    from trainflow.repro.topology import describe_topology

    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # the parts not rerun are kept
    results.pop("three_faults", None)  # replaced by reference_goodput
    results["machine"] = describe_topology()

    with tempfile.TemporaryDirectory(prefix="trainflow-bench-") as folder:
        home = Path(folder)
        prefect_port, s3_port = free_port(), free_port()
        base_env = {**os.environ, "PREFECT_HOME": str(home / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        base_env.pop("PREFECT_API_URL", None)
        prefect = start(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
            base_env,
            f"http://127.0.0.1:{prefect_port}/api/health",
            home / "prefect.log",
        )
        s3 = start(
            [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)],
            base_env,
            f"http://127.0.0.1:{s3_port}/moto-api/",
            home / "moto.log",
            niceness=SERVER_NICENESS,
        )  # it stands in for storage that is not on the training machine
        try:
            env = {
                **base_env,
                "TRAINFLOW_HOME": str(home / "home"),
                "PREFECT_API_URL": f"http://127.0.0.1:{prefect_port}/api",
                "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{s3_port}",
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_DEFAULT_REGION": "us-east-1",
                "BENCH_BUCKET": "trainflow-bench",
            }
            import boto3

            boto3.client(
                "s3",
                endpoint_url=env["AWS_ENDPOINT_URL_S3"],
                region_name="us-east-1",
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
            ).create_bucket(Bucket="trainflow-bench")
            measure = {
                "orchestration": lambda: orchestration(home, env),
                "drills": lambda: drills(env),
                "checkpoint": lambda: checkpoint_bench(env),
                "reference_goodput": lambda: reference_goodput.reference_goodput(env),
                "soak": lambda: soak_bench.soak(env),
                "fsdp_tp": lambda: fsdp_tp_tax.fsdp_tp(home, env),
                "ddp_layout": ddp_layout.ddp_layout,
                "scale": lambda: scale_bench.scale(env),
                "scale_jobs": lambda: scale_jobs.scale_jobs(env),
                "in_place_round": in_place_round.in_place_round,
                "checkpoint_size": lambda: checkpoint_size.checkpoint_size(env),
            }
            for part in parts:
                earlier = results.get(part)
                load_before = os.getloadavg()[0]
                results[part] = measure[part]()
                if isinstance(results[part], dict) and part != "drills":  # drills: drills_run says when
                    results[part]["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                if part == "fsdp_tp":  # a ratio on a shared machine drifts: earlier runs stay on record
                    results[part]["earlier"] = fsdp_tp_tax.earlier_runs(earlier)
                if part in ("orchestration", "drills"):  # the yardstick both compare recovery with
                    restart = statistics.median(measure_torchrun_restart() for _ in range(3))
                if part == "orchestration":
                    results["torchrun_restart_s"] = restart
                if part == "drills":  # with its own yardstick; the table says when, and how busy the machine was
                    results["drills_run"] = {
                        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                        "load_before": load_before,
                        "load_after": os.getloadavg()[0],
                        "torchrun_restart_s": restart,
                    }
                if set(FIRST_PARTS) <= set(parts):  # "in one run" only when they were
                    results["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                write(results)  # each part as soon as it is measured: a later one failing keeps it
        finally:
            stop_server(prefect)
            stop_server(s3)
    headline = {
        "orchestration": lambda r: r["throughput_ratio"],
        "fsdp_tp": lambda r: r.get("throughput_ratio"),
        "ddp_layout": lambda r: r["trainflow_ratio"],
        "scale": lambda r: {f"{x['ranks']}@{x['steps_per_s']:g}": x.get("false_verdicts") for x in r["runs"]},
        "drills": lambda r: sum(1 for d in r.values() if d.get("passed")),
        "reference_goodput": lambda r: r.get("goodput"),
        "soak": lambda r: {name: r[name].get("passed") for name in ("main", "in_place", "storage") if name in r},
        "checkpoint_size": lambda r: {name: s["ratios"] for name, s in r["scenarios"].items()},
    }
    print(json.dumps({part: headline.get(part, lambda r: "measured")(results[part]) for part in parts}, default=str))


if __name__ == "__main__":
    if sys.argv[1:] == ["--from-results"]:  # summaries and BENCHMARKS.md again from the recorded runs
        recorded = json.loads((ROOT / "bench" / "results.json").read_text())
        when = recorded["orchestration"].get("measured_at")
        recorded["orchestration"] = summarize_orchestration(recorded["orchestration"]["rounds"])
        if when:
            recorded["orchestration"]["measured_at"] = when
        write(recorded)
    else:
        main(chosen_parts(sys.argv[1:]))
