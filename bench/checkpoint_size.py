"""Recovery against the size of the training state: the same exception drill at several state sizes,
recovered in place from every rank's memory copy (`fault_tolerance.in_process_restart`) and by a
full restart that reads the state back from checkpoint storage.

    python bench/checkpoint_size.py [--sizes 64,512,1024,2048] [--json]   # MiB of state per rank

The digits workload's width sets the state: its parameters and SGD's momentum buffer, float32,
held whole by each of the 2 DDP ranks (a checkpoint stores one replica, split between the ranks).
Both paths run the same job with the same cadence of checkpoints and memory copies, so the drill
restores the same step either way; the figure is the drill's recovery_s (the failure to every
rank's first step after it) with its phases. Two moments for the fault: long after a save, and two
steps into one, where a recovery in place first lets the save in flight end (runtime/in_place.py)
while a full restart abandons it.

In memory, a rank holds about five times its state at a save: the parameters, their gradients,
DDP's gradient buckets, the momentum, two memory copies, and the save's staging copy (10.9 GB of
resident memory per rank at 2 GiB of state, measured here). Two such ranks do not fit this
machine's 23.5 GiB, so above IN_MEMORY_MAX_MIB only the storage path is measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench_common import ROOT, last_json

SPEC = "examples/digits/spec.yaml"
SIZES_MIB = (64, 512, 1024, 2048)
IN_MEMORY_MAX_MIB = 1024
RANKS = 2
# (steps, checkpoint and memory copy every, fault at): 11 steps after a save, and 2 steps into one
SCENARIOS = {"between_saves": (24, 12, 23), "save_in_flight": (12, 4, 6)}
PATHS = {"in_memory": ["--set", "fault_tolerance.in_process_restart=true"], "storage": []}
KEPT = ("passed", "detected_kind", "recovery_s", "recovery_phases", "lost_steps", "resumed_from_step", "broken_rules")


def parameters(hidden: int) -> int:
    """DigitsNet(hidden): 64 -> hidden -> hidden -> 10, with biases."""
    return 64 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10


def state_bytes(hidden: int) -> int:
    return 2 * 4 * parameters(hidden)  # the parameters and SGD's momentum buffer, float32


def hidden_for(size_bytes: int) -> int:
    """The width whose state is closest to `size_bytes` (the parameters grow as hidden^2 + 76 hidden)."""
    return round((-76 + math.sqrt(76**2 + 4 * (size_bytes / 8 - 10))) / 2)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def drill(env: dict, hidden: int, path: str, checkpoints: str, scenario: str) -> dict:
    steps, every, at_step = SCENARIOS[scenario]
    args = [
        "drill",
        SPEC,
        "--fault",
        "exception",
        "--at-step",
        str(at_step),
        "--set",
        f"workload.steps={steps}",
        "--set",
        f"workload.args=['--hidden', '{hidden}']",
        "--set",
        f"checkpoint.uri={checkpoints}",
        "--set",
        f"checkpoint.every_steps={every}",
        "--set",
        f"checkpoint.memory_every_steps={every}",
        *PATHS[path],
        "--no-compare-torchrun",
        "--json",
    ]
    try:
        report = last_json(args, env, timeout_s=1800)
    except (RuntimeError, OSError, ValueError) as exc:
        return {"error": str(exc)[-500:]}
    return {key: report.get(key) for key in KEPT} | {"run_id": report.get("run_id")}


def measure(env: dict, size_mib: int, scenario: str) -> dict:
    hidden = hidden_for(size_mib * 2**20)
    checkpoints = f"checkpoints/checkpoint-size-{scenario}-{size_mib}"
    row = {"size_mib": size_mib, "hidden": hidden, "state_bytes_per_rank": state_bytes(hidden)}
    # storage first: it runs the fault-free baseline (without memory copies) that in memory reuses
    row["storage"] = drill(env, hidden, "storage", checkpoints, scenario)
    row["in_memory"] = (
        drill(env, hidden, "in_memory", checkpoints, scenario)
        if size_mib <= IN_MEMORY_MAX_MIB
        else {"error": f"two ranks' memory copies of {size_mib} MiB do not fit this machine's memory"}
    )
    home = Path(env["TRAINFLOW_HOME"])
    first_save = f"step-{SCENARIOS[scenario][1]:08d}"
    resumed = home / checkpoints / str(row["storage"].get("run_id")) / first_save
    row["checkpoint_bytes"] = folder_bytes(resumed) if resumed.is_dir() else None
    shutil.rmtree(home / checkpoints, ignore_errors=True)  # gigabytes a size, on the machine's one disk
    return row


def ratios(runs: list[dict]) -> dict:
    """In-memory recovery / storage recovery at each size both were measured, and each path's growth
    from the smallest size it was measured at to the largest (also in seconds per GiB of state)."""
    figures: dict = {
        "in_memory_over_storage": {
            r["size_mib"]: round(r["in_memory"]["recovery_s"] / r["storage"]["recovery_s"], 3)
            for r in runs
            if all(r[p].get("recovery_s") is not None for p in PATHS)
        }
    }
    for path in PATHS:
        done = [r for r in runs if r[path].get("recovery_s") is not None]
        if len(done) < 2:
            continue
        small, large = done[0], done[-1]
        gib = (large["state_bytes_per_rank"] - small["state_bytes_per_rank"]) / 2**30
        figures[path] = {
            "from_mib": small["size_mib"],
            "to_mib": large["size_mib"],
            "growth": round(large[path]["recovery_s"] / small[path]["recovery_s"], 2),
            "s_per_gib": round((large[path]["recovery_s"] - small[path]["recovery_s"]) / gib, 3),
        }
    if "in_memory" in figures and "storage" in figures:  # the storage path over the in-memory path's range
        ends = [r for r in runs if r["size_mib"] in (figures["in_memory"]["from_mib"], figures["in_memory"]["to_mib"])]
        figures["storage_over_in_memory_range"] = round(
            ends[-1]["storage"]["recovery_s"] / ends[0]["storage"]["recovery_s"], 2
        )
    return figures


def checkpoint_size(env: dict, sizes: tuple[int, ...] = SIZES_MIB) -> dict:
    """The `checkpoint_size` part of `make bench`."""
    scenarios = {}
    for name, (steps, every, at_step) in SCENARIOS.items():
        runs = [measure(env, size, name) for size in sizes]
        scenarios[name] = {"steps": steps, "every": every, "at_step": at_step, "runs": runs, "ratios": ratios(runs)}
    return {"ranks": RANKS, "in_memory_max_mib": IN_MEMORY_MAX_MIB, "commit": commit(), "scenarios": scenarios}


def commit() -> str | None:
    """The code measured: in-process restart changes from one commit to the next."""
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return found.stdout.strip() or None


IN_MEMORY_PHASES = ("abort_s", "rejoin_s", "restore_s", "first_step")
SCENARIO_LINES = {
    "between_saves": "The fault long after a save (step {at}, {steps} steps, a checkpoint and a memory copy every "
    "{every}): the save has ended, or nearly (in memory the abort phase waits for what is left of it).",
    "save_in_flight": "The fault two steps into a save (step {at}, {steps} steps, a checkpoint and a memory copy "
    "every {every}): a recovery in place first lets the save in flight end (its abort phase), a full restart "
    "abandons it.",
}


def _in_memory_phases(report: dict) -> dict:
    """The recorded phases, and the rest of the recovery: the first step (with the restored step's
    checkpoint saved again where that step was a scheduled one)."""
    phases = dict(report.get("recovery_phases") or {})
    phases["first_step"] = max(0.0, report["recovery_s"] - sum(phases.get(n) or 0.0 for n in IN_MEMORY_PHASES[:3]))
    return phases


def _path_cells(report: dict, names: tuple[str, ...]) -> str:
    if "error" in report or report.get("recovery_s") is None:
        why = report.get("error") or "; ".join(report.get("broken_rules") or []) or "no recovery recorded"
        return f"not measured: {why[:120]} | "
    phases = _in_memory_phases(report) if names == IN_MEMORY_PHASES else report.get("recovery_phases") or {}
    cells = " / ".join("–" if phases.get(name) is None else f"{phases[name]:.2f}" for name in names)
    return f"{report['recovery_s']:.2f}{'' if report.get('passed') else ' (drill failed)'} | {cells}"


def scenario_lines(name: str, scenario: dict) -> list[str]:
    from trainflow.contracts.recovery import PHASES

    lines = [
        "",
        SCENARIO_LINES[name].format(at=scenario["at_step"], steps=scenario["steps"], every=scenario["every"]),
        "",
        "| state per rank (MiB) | hidden | checkpoint (MB) | in memory (s) | abort / rejoin / restore / first step "
        "| storage (s) | stop / between / launch / imports / rendezvous / restore / first step | in memory / storage |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_size = scenario["ratios"].get("in_memory_over_storage", {})
    for row in scenario["runs"]:
        stored = "–" if row.get("checkpoint_bytes") is None else f"{row['checkpoint_bytes'] / 1e6:.0f}"
        ratio = by_size.get(row["size_mib"], by_size.get(str(row["size_mib"])))
        lines.append(
            f"| {row['state_bytes_per_rank'] / 2**20:.0f} | {row['hidden']} | {stored} | "
            f"{_path_cells(row['in_memory'], IN_MEMORY_PHASES)} | {_path_cells(row['storage'], PHASES)} | "
            f"{'–' if ratio is None else f'{ratio:.2f}'} |"
        )
    for path, label in (("in_memory", "in memory"), ("storage", "by storage")):
        if growth := scenario["ratios"].get(path):
            lines += [
                "",
                f"Recovery {label}, from {growth['from_mib']} MiB to {growth['to_mib']} MiB per rank: "
                f"{growth['growth']:.2f}x ({growth['s_per_gib']:.2f} s more per GiB of state per rank).",
            ]
    if "storage_over_in_memory_range" in (ratios := scenario["ratios"]):
        flat = ratios["in_memory"]["growth"] < ratios["storage_over_in_memory_range"]
        lines += [
            "",
            f"Over the same range ({ratios['in_memory']['from_mib']} to {ratios['in_memory']['to_mib']} MiB) by "
            f"storage: {ratios['storage_over_in_memory_range']:.2f}x. The in-memory path grows "
            + ("less than the storage path." if flat else "more than the storage path: it does not stay flat here."),
        ]
    return lines


def markdown(result: dict) -> list[str]:
    lines = [
        "## Recovery against checkpoint size",
        "",
        f"`python bench/checkpoint_size.py` (measured {result.get('measured_at', '–')}, commit "
        f"{result.get('commit') or '–'}): the exception drill on the "
        "digits workload widened until its training state (parameters and SGD's momentum, float32) is the size "
        f"given, held whole by each of the {result['ranks']} DDP ranks (the job's state is {result['ranks']} times "
        "that; a checkpoint stores one replica, split between the ranks). In memory: "
        "`fault_tolerance.in_process_restart`, recovered within the attempt from every rank's memory copy. "
        "Storage: the same drill without it, a full restart whose ranks read the state back from the checkpoint "
        "(the node-local tier on this machine's disk, every file checked against its sha256 first; files written "
        "seconds before are likely still in the page cache). Both paths go back to the same step. Recovery is "
        "the failure to every rank's first step after it, so both include one step, and both build the model "
        "and its DDP wrapper again (the script runs again: the rejoin phase in memory). Above "
        f"{result['in_memory_max_mib']} MiB only the storage path is measured: a rank holds about five times "
        "its state at a save (parameters, gradients, DDP's gradient buckets, momentum, two memory copies, the "
        "save's staging copy; 10.9 GB resident per rank at 2 GiB of state), and two such ranks do not fit this "
        "machine's 23.5 GiB. In memory, first step is the rest of the recovery after the restore: the first "
        "step, and the restored step's checkpoint saved again (it was a scheduled one). One drill per size and "
        "path on this shared 2-core machine: a single figure can be off by a second or two.",
    ]
    for name, scenario in result["scenarios"].items():
        lines += scenario_lines(name, scenario)
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES_MIB), help="MiB of state per rank")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainflow-checkpoint-size-") as folder:
        env = {**os.environ, "TRAINFLOW_HOME": f"{folder}/home", "PREFECT_HOME": f"{folder}/prefect"}
        env.pop("PREFECT_API_URL", None)  # each drill starts Prefect's temporary server
        result = checkpoint_size(env, tuple(int(s) for s in args.sizes.split(",")))
    print(json.dumps(result) if args.json else "\n".join(markdown(result)))


if __name__ == "__main__":
    main()
