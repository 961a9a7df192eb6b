"""`make bench`'s orchestration tax of the FSDP2 + TP example (examples/fsdp_tp, a 2-D mesh dp 2 x
tp 2 on 4 CPU processes): trainflow against the same model, layout and data under bare torchrun
(bench/bare_fsdp_tp.py), in interleaved rounds like the reference workload's tax."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from bench_common import BIN, ROOT, last_json, steps_per_s

SPEC = "examples/fsdp_tp/spec.yaml"
STEPS, ROUNDS = 150, 5


def bare(home: Path) -> dict:
    out = home / "bare-fsdp-tp.json"
    launched = time.time()
    subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "4",
            "--log-dir",
            str(home / "torchrun"),
            "bench/bare_fsdp_tp.py",
            "--tp",
            "2",
            "--steps",
            str(STEPS),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "BENCH_LAUNCHED_AT": str(launched)},
        check=True,
        capture_output=True,
        timeout=900,
    )
    stamps = json.loads(out.read_text())["stamps"]
    return {"steps_per_s": steps_per_s(list(enumerate(stamps, start=1))), "startup_s": stamps[0] - launched}


def under_trainflow(env: dict) -> dict:
    from mlflow.tracking import MlflowClient

    launched = time.time()
    summary = last_json(
        ["run", SPEC, "--set", f"workload.steps={STEPS}", "--set", f"checkpoint.every_steps={STEPS}", "--json"],
        env,
        timeout_s=900,
    )
    if summary.get("status") != "succeeded":
        raise RuntimeError(f"the FSDP2 + TP run did not succeed: {summary.get('reason')}")
    history = MlflowClient(summary["tracking_uri"]).get_metric_history(summary["mlflow_run_id"], "loss")
    points = [(m.step, m.timestamp / 1000) for m in history]
    return {
        "steps_per_s": steps_per_s(points),
        "startup_s": min(t for _, t in points) - launched,
        "final_loss": summary.get("final_loss"),
    }


def fsdp_tp(home: Path, env: dict) -> dict:
    """Bare, then trainflow, ROUNDS times; the ratio is the median of the rounds' ratios."""
    measured_at, before = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    rounds: dict[str, list[dict]] = {"bare": [], "trainflow": []}
    try:
        for _ in range(ROUNDS):
            rounds["bare"].append(bare(home))
            rounds["trainflow"].append(under_trainflow(env))
    except (RuntimeError, subprocess.SubprocessError, ValueError) as exc:
        return {"error": str(exc)[-800:], "rounds": rounds, "measured_at": measured_at}
    ratios = [
        round(ours["steps_per_s"] / plain["steps_per_s"], 4) for plain, ours in zip(rounds["bare"], rounds["trainflow"])
    ]
    return {
        "measured_at": measured_at,
        "steps": STEPS,
        "load_before": before,
        "load_after": os.getloadavg(),
        "bare": {k: statistics.median(r[k] for r in rounds["bare"]) for k in ("steps_per_s", "startup_s")},
        "trainflow": {k: statistics.median(r[k] for r in rounds["trainflow"]) for k in ("steps_per_s", "startup_s")},
        "throughput_ratio": statistics.median(ratios),
        "throughput_ratio_per_round": ratios,
        "rounds": rounds,
    }


def earlier_runs(previous: dict | None) -> list[dict]:
    """The headline of every earlier measurement, newest last, for the record beside the new one."""
    if not previous or "throughput_ratio" not in previous:
        return list((previous or {}).get("earlier", []))
    keys = ("measured_at", "throughput_ratio", "throughput_ratio_per_round", "load_before")
    return [*previous.get("earlier", []), {k: previous.get(k) for k in keys}]


def markdown(tax: dict) -> list[str]:
    title = (
        f"## Orchestration tax, FSDP2 + TP (examples/fsdp_tp: dp 2 x tp 2, 4 processes, gloo on CPU; "
        f"{STEPS} steps, {ROUNDS} interleaved rounds)"
    )
    if "error" in tax:
        return [title, "", f"not measured ({tax['measured_at']}): {tax['error'][:400]}", ""]
    return [
        title,
        "",
        f"Measured {tax['measured_at']}; load average (1, 5, 15 min) before "
        f"{', '.join(f'{x:.1f}' for x in tax['load_before'])}, "
        f"after {', '.join(f'{x:.1f}' for x in tax['load_after'])} "
        "(the machine is shared: other work runs beside the rounds).",
        "",
        "| | bare torchrun | trainflow | ratio (target ≥ 0.95) |",
        "|---|---|---|---|",
        f"| training steps/s | {tax['bare']['steps_per_s']:.2f} | {tax['trainflow']['steps_per_s']:.2f} | "
        f"{tax['throughput_ratio']:.3f} (rounds: {', '.join(f'{r:.3f}' for r in tax['throughput_ratio_per_round'])}) |",
        f"| start-up to first step (s) | {tax['bare']['startup_s']:.2f} | {tax['trainflow']['startup_s']:.2f} | |",
        "",
        *[
            f"An earlier run, {run['measured_at']} (load average before: "
            f"{', '.join(f'{x:.1f}' for x in run['load_before'])}): ratio {run['throughput_ratio']:.3f} (rounds: "
            f"{', '.join(f'{r:.3f}' for r in run['throughput_ratio_per_round'])})."
            for run in tax.get("earlier", [])
        ],
        f"The rounds spread from {min(tax['throughput_ratio_per_round']):.3f} to "
        f"{max(tax['throughput_ratio_per_round']):.3f}: on this shared 2-core machine one round says little.",
        "",
        "Bare torchrun runs the example's own model, tensor-parallel plan, data and optimizer on the same 2-D "
        "mesh as one host with 4 processes; trainflow runs the example as 2 local nodes x 2 processes, "
        "checkpointing only at the last step, so the figure is the orchestration itself.",
        "",
    ]
