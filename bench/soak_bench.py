"""`make bench`'s soak: one long job with >= 30 faults of every kind the local backend can soak,
with a busy loop per core beside it, and a second, shorter one on S3 for the kind that needs a
store to cut (a node in a network namespace cannot reach the S3 endpoint on this host's loopback,
so node loss and storage outage are not soaked in one run)."""

from __future__ import annotations

import os
import subprocess
import time

from bench_common import last_json

SPEC = "examples/digits/spec.yaml"
FAULTS, SEED = 30, 11
STORAGE_FAULTS, STORAGE_KINDS = 6, "storage-outage,corrupt-checkpoint,kill"
JOB = [
    "--set",
    "checkpoint.every_steps=20",
    "--set",
    "fault_tolerance.hang_timeout_s=5",
    "--set",
    "fault_tolerance.heartbeat_timeout_s=4",
    "--load",
    "--json",
]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def one_soak(env: dict, faults: int, extra: list[str]) -> dict:
    steps = (faults + 1) * 50  # 2.5 checkpoint intervals per fault
    before, started = uptime(), time.monotonic()
    try:
        report = last_json(
            [
                "soak",
                SPEC,
                "--faults",
                str(faults),
                "--seed",
                str(SEED),
                "--set",
                f"workload.steps={steps}",
                *JOB,
                *extra,
            ],
            env,
            timeout_s=3600,
        )
    except (RuntimeError, subprocess.SubprocessError, ValueError) as exc:
        return {"error": str(exc)[-800:], "uptime_before": before, "uptime_after": uptime()}
    report.update(steps=steps, wall_s=round(time.monotonic() - started, 1), uptime_before=before, uptime_after=uptime())
    return report


def soak(env: dict) -> dict:
    return {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(),
        "main": one_soak(env, FAULTS, []),
        "in_place": one_soak(env, FAULTS, ["--set", "fault_tolerance.in_process_restart=true"]),
        "storage": one_soak(
            env, STORAGE_FAULTS, ["--kinds", STORAGE_KINDS, "--set", f"checkpoint.uri=s3://{env['BENCH_BUCKET']}/soak"]
        ),
    }


def confusion_table(report: dict) -> list[str]:
    detected = sorted({str(c["detected"]) for c in report["confusion"]})
    cells = {(c["injected"], str(c["detected"])): c["count"] for c in report["confusion"]}
    lines = [
        "| injected \\ detected | " + " | ".join(detected) + " | lost steps (each fault) |",
        "|---|" + "---|" * (len(detected) + 1),
    ]
    for kind in sorted({c["injected"] for c in report["confusion"]}):
        lost = [f["lost_steps"] for f in report["per_fault"] if f["kind"] == kind]
        lines.append(
            f"| {kind} | "
            + " | ".join(str(cells.get((kind, d), "")) for d in detected)
            + f" | {', '.join(str(x) for x in lost)} |"
        )
    return lines


def soak_lines(title: str, report: dict) -> list[str]:
    lines = [f"### {title}", ""]
    if "error" in report or "confusion" not in report:
        return lines + [
            f"not measured: {str(report.get('error') or report.get('reason'))[:400]}",
            f"(uptime before: `{report.get('uptime_before')}`)",
            "",
        ]
    load = report.get("load") or {}
    lines += [
        f"{report['faults']} faults, seed {report['seed']}, {report['steps']} steps, checkpoint every 20; "
        f"kinds {', '.join(report['kinds'])}; {report['wall_s']} s. "
        f"Load beside it: {load.get('processes')} busy loop(s) at nice {load.get('niceness')}.",
        f"Machine load: before `{report['uptime_before']}`; after `{report['uptime_after']}`.",
        "",
        *confusion_table(report),
        "",
        f"- verdict: {'PASSED' if report['passed'] else 'FAILED'}; run status {report['status']}",
        f"- exact resume (final params_sha256 = the fault-free baseline's): {report['params_match_baseline']}",
        f"- misclassified: {len(report['misclassified'])}; unexplained attempts: "
        f"{len(report['unexplained_attempts'])}; successes recorded as failures: "
        f"{len(report['successes_recorded_as_failures'])}",
        f"- injected late (more than 1 step after the step asked for): {len(report['late_injections'])}; "
        f"lost more than allowed: {len(report['over_lost'])}; damaged checkpoints loaded: "
        f"{len(report.get('damaged_checkpoints_loaded', []))}",
        f"- leftovers (processes, namespaces, ports): {report['leftovers'] or 'none'}",
    ]
    for name, rows in (
        ("misclassified", report["misclassified"]),
        ("late", report["late_injections"]),
        ("over lost", report["over_lost"]),
        ("unexplained", report["unexplained_attempts"]),
    ):
        for row in rows[:6]:
            lines.append(f"  - {name}: {row}")
    for kind, why in report.get("kinds_not_soaked", {}).items():
        lines.append(f"- not soaked here: {kind}: {why}")
    return lines + [""]


def markdown(soaked: dict) -> list[str]:
    runs = [r for name in ("main", "in_place", "storage") if "confusion" in (r := soaked.get(name, {}))]
    kinds = sorted({k for r in runs for k in r["kinds"]})
    return [
        f"## Soak (`trainflow soak --load`; measured {soaked['measured_at']}, {soaked['cores']} cores)",
        "",
        f"{sum(r['faults'] for r in runs)} faults of {len(kinds)} kinds ({', '.join(kinds)}) in {len(runs)} soak(s); "
        f"passed: {', '.join(str(r['passed']) for r in runs)}.",
        "",
        *soak_lines("Every kind on local checkpoints", soaked["main"]),
        *(
            soak_lines(
                "Every kind with `fault_tolerance.in_process_restart` (crashes, kills, hangs and exceptions "
                "recovered within their attempt)",
                soaked["in_place"],
            )
            if "in_place" in soaked
            else []
        ),
        *soak_lines("Storage outage on S3 (moto_server behind a relay the soak stalls)", soaked["storage"]),
    ]
