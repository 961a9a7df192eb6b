"""BENCHMARKS.md from bench/results.json: each part's section, with the figures it recorded."""

from __future__ import annotations

import checkpoint_size  # bench/, beside this module
import ddp_layout
import fsdp_tp_tax
import in_place_round
import reference_goodput
import scale_bench
import scale_jobs
import soak_bench

from trainflow.contracts.recovery import PHASES as RECOVERY_PHASES

STEPS = 2000  # the orchestration tax's run length
ROUNDS = 5  # and its interleaved rounds
FIRST_PARTS = ("orchestration", "drills", "checkpoint")
PARTS = (
    *FIRST_PARTS,
    "reference_goodput",
    "soak",
    "fsdp_tp",
    "ddp_layout",
    "scale",
    "scale_jobs",
    "in_place_round",
    "checkpoint_size",
)


def markdown(results: dict) -> str:
    tax, ck = results["orchestration"], results["checkpoint"]
    lines = [
        "# Benchmarks",
        "",
        "Every figure below was produced by `make bench` (bench/run_benchmarks.py) on this machine; each section",
        "says when it was measured; the raw numbers are in bench/results.json.",
        "",
        "```",
        results["machine"].strip(),
        "```",
        "",
        f"## Orchestration tax (reference workload, {STEPS} steps, 2 ranks, gloo on CPU; {ROUNDS} interleaved "
        "rounds: steps/s are medians of the runs, ratios the median of the rounds' ratios)"
        + (f"; measured {tax['measured_at']}" if "measured_at" in tax else ""),
        "",
        "| | bare torchrun | trainflow | ratio (target ≥ 0.95) |",
        "|---|---|---|---|",
        f"| training steps/s | {tax['bare']['steps_per_s']:.1f} | {tax['trainflow']['steps_per_s']:.1f} | "
        f"{tax['throughput_ratio']:.3f} (rounds: {', '.join(f'{r:.3f}' for r in tax['throughput_ratio_per_round'])}) |",
        f"| start-up to first step (s) | {tax['bare']['startup_s']:.2f} | {tax['trainflow']['startup_s']:.2f} | |",
        f"| steps/s with a checkpoint every 50 steps | | {tax['trainflow_with_checkpoints']['steps_per_s']:.1f} | "
        f"{tax['throughput_ratio_with_checkpoints']:.3f} (rounds: "
        f"{', '.join(f'{r:.3f}' for r in tax['throughput_ratio_with_checkpoints_per_round'])}) |",
        *memory_copies_row(tax),
        "",
        "The first trainflow row checkpoints only at the last step, so it measures the orchestration itself "
        "(heartbeats, progress reports, control points); the last row adds the reference spec's checkpoint "
        "interval, a save to the node-local tier every 50 steps "
        f"(every {50 / tax['trainflow_with_checkpoints']['steps_per_s']:.2f} s at this step rate), "
        f"whose stall share of step time was {tax['trainflow_with_checkpoints']['checkpoint_share']:.1%} "
        "(the background writes compete with training for this machine's 2 cores; see Checkpoints). "
        f"torchrun's own worker restart, restoring nothing: {results['torchrun_restart_s']:.2f} s.",
        "",
        "## Drills (80 steps, checkpoint every 10, fault at step 30; the straggler: 600 steps, checkpoint every 100; "
        "the storage outage: 4000 steps, checkpoint every 200)"
        + (f"; measured {results['drills_run']['measured_at']}, see Recovery" if "drills_run" in results else ""),
        "",
        "| fault | detected as | detection (s) | recovery (s) | recovery / torchrun | lost steps | exact resume "
        "| released |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, report in results["drills"].items():
        if "error" in report:
            lines.append(f"| {kind} | error: {report['error'][:80]} | | | | | | |")
            continue
        ratio = f"{report['recovery_s'] / drills_restart_s(results):.2f}x" if report["recovery_s"] is not None else "–"
        lines.append(
            f"| {kind} | {report['detected_kind']} | {report['detection_latency_s']} | {report['recovery_s']} | "
            f"{ratio} | {report['lost_steps']} | {report['params_match_baseline']} | {report['resources_released']} |"
        )
    lines += grow_back_lines(results["drills"])
    lines += in_place_lines(results["drills"], drills_restart_s(results))
    lines += recovery_table(results)
    lines += ["", "## Checkpoints" + (f" (measured {ck['measured_at']})" if "measured_at" in ck else ""), ""]
    if "error" in ck:
        lines.append(f"not measured: {ck['error'][:300]}")
    else:
        lines += ["| figure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in ck.items() if k != "measured_at"]
    return "\n".join(lines + [""])


def grow_back_lines(drills: dict) -> list[str]:
    """What the drill of a lost node replaced later shows beyond the table: the sizes, the stop's cost."""
    report = drills.get("node-loss-replaced-later")
    if not report or "error" in report or "world_sizes" not in report:
        return []
    sizes = " -> ".join(str(s) for s in report["world_sizes"])
    return [
        "",
        f"node-loss-replaced-later: the node is lost for good, the job shrinks (world sizes {sizes}) and resumes "
        f"from step {report['resumed_from_step']}, the newest local checkpoint, which the lost node's buddy also "
        f"held; once the node's replacement is there the job stops at its next control point to grow back, "
        f"losing {report['resize_lost_steps']} step(s), and the grown attempt's first step comes "
        f"{report['resize_recovery_s']} s after the stop (an emergency checkpoint, a new launch, a resharded "
        f"restore).",
    ]


def memory_copies_row(tax: dict) -> list[str]:
    """In-process restart's memory copies on, against trainflow without them in the same rounds."""
    if "memory_copies_ratio" not in tax:
        return []
    return [
        f"| steps/s with in-process restart's memory copies (`fault_tolerance.in_process_restart`) | | "
        f"{tax['trainflow_with_memory_copies']['steps_per_s']:.1f} | {tax['memory_copies_ratio']:.3f} of trainflow "
        f"without them, target ≥ 0.98 (rounds: {', '.join(f'{r:.3f}' for r in tax['memory_copies_ratio_per_round'])}); "
        f"{tax['throughput_ratio_with_memory_copies']:.3f} of bare torchrun |",
        *(
            [
                f"| a memory copy: median cost, cadence, share of the step time | | "
                f"{copies['memory_copy_s'] * 1e6:.0f} µs every {copies['memory_copy_every_steps']:.0f} steps | "
                f"{copies['memory_copy_share']:.2%} of the step time, the cadence's aim ≤ 2% (rounds: "
                + ", ".join(f"{r['memory_copy_share']:.2%}" for r in tax["rounds"]["trainflow_with_memory_copies"])
                + ") |"
            ]
            if "memory_copy_share" in (copies := tax["trainflow_with_memory_copies"])
            else []
        ),
    ]


def in_place_lines(drills: dict, restart_s: float) -> list[str]:
    """The drills recovered in place (`<kind>-in-place`), each beside the same drill's full restart."""
    rows = []
    for name, report in drills.items():
        if not name.endswith("-in-place") or "error" in report or report.get("recovery_s") is None:
            continue
        kind = name.removesuffix("-in-place")
        restarted = drills.get(kind) or {}
        phases = report.get("recovery_phases") or {}
        by_restart = restarted.get("recovery_s")
        rows.append(
            f"| {kind} | {report['recovery_s']:.3f} | {report['recovery_s'] / restart_s:.2f}x | "
            + (f"{by_restart:.2f} |" if by_restart is not None else "– |")
            + f" {report['ranks_kept']} / {report['ranks_replaced']} | {report['lost_steps']} "
            f"(copies every {report.get('memory_copy_every_steps')}) | "
            + " | ".join(f"{phases[p]:.3f}" if p in phases else "–" for p in IN_PLACE_PHASES)
            + f" | {'passed' if report.get('passed') else 'FAILED'} |"
        )
    if not rows:
        return []
    return [
        "",
        "With `fault_tolerance.in_process_restart` the same faults are recovered within the attempt: the healthy "
        f"ranks keep their processes and go back to their memory copies; a dead or frozen rank's process is "
        f"replaced by one that takes its copies over from the node's shared memory. torchrun's own restart: "
        f"{restart_s:.2f} s. Phases (slowest rank): abort (the save in flight ended, the groups broken off), rejoin "
        "(the round, the new group, the script run again up to `restore()`), of which replace (the new process's "
        "start, to its report to the round), restore (from memory); then the first step.",
        "",
        "| fault | in place (s) | vs torchrun | by restart (s) | ranks kept / replaced | steps lost | abort "
        "| rejoin | replace | restore | drill |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]


IN_PLACE_PHASES = ("abort_s", "rejoin_s", "replace_s", "restore_s")


def drills_restart_s(results: dict) -> float:
    """torchrun's restart measured with the drills; an older results file has only the orchestration's."""
    return results.get("drills_run", {}).get("torchrun_restart_s", results["torchrun_restart_s"])


def failed_drills(drills: dict) -> list[str]:
    failed = [kind for kind, report in drills.items() if not report.get("passed")]
    return (
        [f"Drills that did not pass in this run: {', '.join(failed)} (their figures are in the table above).", ""]
        if failed
        else []
    )


def recovery_table(results: dict) -> list[str]:
    """Per fault kind: trainflow's recovery beside torchrun's own restart of the same run, and where
    the recovery went (contracts/recovery.py)."""
    restart, run = drills_restart_s(results), results.get("drills_run")
    when = (
        (
            f"Measured {run['measured_at']} with the drills above, under a 1-minute load average of "
            f"{run['load_before']:.1f} before and {run['load_after']:.1f} after (other processes sharing this "
            "machine's cores; figures under load are slower than on a quiet machine). "
        )
        if run
        else ""
    )
    lines = [
        "",
        "## Recovery against torchrun's own restart (detection to the first new step, state restored)",
        "",
        f"{when}torchrun's stateless worker restart in the same run: {restart:.2f} s. Phases in seconds, each to the "
        "slowest rank's point: stop (the failed attempt ended), between attempts (release, classify, record, "
        "back-off, launch task), launch (to the workers' process start, a fork with warm workers), imports (to "
        "`trainflow.runtime.init()`), rendezvous (process group joined), restore, first step.",
        "",
        *failed_drills(results["drills"]),
        "| fault | recovery (s) | torchrun restart (s) | ratio | stop | between | launch | imports | rendezvous "
        "| restore | first step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, report in results["drills"].items():
        phases = report.get("recovery_phases")
        if "error" in report or report.get("recovery_s") is None or not phases:
            continue
        if not any(name in phases for name in RECOVERY_PHASES):  # a recovery in place: its own line above
            continue
        cells = " | ".join("–" if phases.get(name) is None else f"{phases[name]:.2f}" for name in RECOVERY_PHASES)
        lines.append(
            f"| {kind} | {report['recovery_s']:.2f} | {restart:.2f} | {report['recovery_s'] / restart:.2f}x | {cells} |"
        )
    return lines


def render(results: dict) -> str:
    """BENCHMARKS.md from whatever parts bench/results.json holds, each section with its own figures."""
    if all(part in results for part in FIRST_PARTS):
        text = markdown(results)
    else:
        text = "\n".join(
            [
                "# Benchmarks",
                "",
                "Produced by `make bench` (bench/run_benchmarks.py); the raw numbers are in bench/results.json.",
                "",
                "```",
                results["machine"].strip(),
                "```",
                "",
            ]
        )
    extra = []
    if "reference_goodput" in results:
        extra += reference_goodput.markdown(results["reference_goodput"])
    if "soak" in results:
        extra += soak_bench.markdown(results["soak"])
    if "fsdp_tp" in results:
        extra += fsdp_tp_tax.markdown(results["fsdp_tp"])
    if "ddp_layout" in results:
        extra += ddp_layout.markdown(results["ddp_layout"])
    if "scale" in results:
        extra += scale_bench.markdown(results["scale"])
    if "scale_jobs" in results:
        extra += scale_jobs.markdown(results["scale_jobs"])
    if "in_place_round" in results:
        extra += in_place_round.markdown(results["in_place_round"])
    if "checkpoint_size" in results:
        extra += checkpoint_size.markdown(results["checkpoint_size"])
    commands = [
        "Commands: `make bench` (everything), `python bench/run_benchmarks.py --only soak,fsdp_tp` (some "
        f"parts of {', '.join(PARTS)}; the others' figures are kept), `trainflow drill SPEC --fault KIND "
        "--json`, `trainflow soak SPEC --faults N --load --json`, `trainflow bench checkpoint --json`, "
        "`trainflow bench scale --ranks N --steps-per-s R --json`.",
        "",
    ]
    return text + "\n" + "\n".join(extra + commands)
