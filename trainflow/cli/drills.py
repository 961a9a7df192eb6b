"""`trainflow drill` and `trainflow soak`: faults injected from outside, and what the run made of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from trainflow.cli.output import EXIT_FAILED, fail_input
from trainflow.cli.quota import quota_problem
from trainflow.cli.signals import orchestrating
from trainflow.runspec import SpecError, load_spec


def drill(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Run spec (YAML).")],
    fault: Annotated[
        str,
        typer.Option(
            "--fault", help="crash, kill, hang, straggler, preempt, node-loss, storage-outage or corrupt-checkpoint."
        ),
    ],
    at_step: Annotated[
        int | None, typer.Option("--at-step", help="Inject once every rank reached this step (default 30).")
    ] = None,
    at_s: Annotated[
        float | None, typer.Option("--at-s", help="Plain scripts: inject this many seconds after the attempt's launch.")
    ] = None,
    rank: Annotated[int | None, typer.Option("--rank", help="Target rank (process faults).")] = None,
    node: Annotated[int | None, typer.Option("--node", help="Target node (preempt, node-loss).")] = None,
    duration_s: Annotated[float, typer.Option("--duration", help="Straggler or outage length (s).")] = 8.0,
    permanent: Annotated[bool, typer.Option("--permanent", help="node-loss: the node never comes back.")] = False,
    replaced_later: Annotated[
        bool,
        typer.Option(
            "--replaced-later",
            help="node-loss --permanent: a replacement node is there once the job has shrunk; it grows back.",
        ),
    ] = False,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a spec field.")] = None,
    fresh_baseline: Annotated[bool, typer.Option("--fresh-baseline", help="Do not reuse a baseline.")] = False,
    compare_torchrun: Annotated[
        bool, typer.Option("--compare-torchrun/--no-compare-torchrun", help="Also time torchrun's own restart.")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the drill report.")] = False,
) -> None:
    """Inject one fault from outside into a run and report detection, recovery and exactness."""
    from pydantic import ValidationError

    from trainflow.drills.chaos import FaultPlan
    from trainflow.drills.drill import check_plan, drill_spec
    from trainflow.preflight import preflight

    if rank is not None and node is not None:
        fail_input("--rank and --node: give one target, not both", as_json)
    if at_step is not None and at_s is not None:
        fail_input("--at-step and --at-s: give one moment, not both", as_json)
    try:
        plan = FaultPlan(
            kind=fault,
            at_step=30 if at_step is None else at_step,
            at_s=at_s,
            rank=rank,
            node=node,
            duration_s=duration_s,
            permanent=permanent,
            replaced_later=replaced_later,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        fail_input(f"--{'fault' if first['loc'][0] == 'kind' else first['loc'][0]}: {first['msg']}", as_json)
    try:
        spec = load_spec(spec_path, overrides or [])
        check_plan(spec, plan)
        preflight(drill_spec(spec, plan))
    except SpecError as exc:
        fail_input(str(exc), as_json)

    with orchestrating():
        problem = quota_problem(drill_spec(spec, plan))
        if problem:
            fail_input(problem, as_json)
        from flows.drill import fault_drill

        state = fault_drill(
            spec, plan, fresh_baseline=fresh_baseline, compare_torchrun=compare_torchrun, return_state=True
        )
    report = state.result(raise_on_failure=False)
    if not isinstance(report, dict):
        typer.echo(f"trainflow: the drill crashed: {state.message}", err=True)
        if as_json:  # --json always ends with a JSON line
            typer.echo(
                json.dumps(
                    {
                        "fault": plan.kind.value,
                        "passed": False,
                        "status": "crashed",
                        "broken_rules": [f"the drill crashed: {state.message}"],
                    }
                )
            )
        raise typer.Exit(EXIT_FAILED)
    print_drill(report)
    if as_json:
        typer.echo(json.dumps(report, default=str))
    raise typer.Exit(0 if report["passed"] else EXIT_FAILED)


def soak(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Run spec (YAML).")],
    faults: Annotated[int, typer.Option("--faults", min=1, help="How many faults, of every kind in turn.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the faults' kinds, steps and ranks.")] = 0,
    load: Annotated[
        bool, typer.Option("--load", help="A busy loop per core beside the job for the whole soak.")
    ] = False,
    load_niceness: Annotated[
        int, typer.Option("--load-niceness", min=0, max=19, help="Nice value of the busy loops.")
    ] = 0,
    kinds: Annotated[
        str | None,
        typer.Option(
            "--kinds", help="Comma-separated fault kinds (default: every kind this machine and spec can soak)."
        ),
    ] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a spec field.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the soak report.")] = False,
) -> None:
    """One longer job with many faults at random steps: confusion matrix, lost steps, exactness, leftovers."""
    from trainflow.drills.chaos import FaultKind
    from trainflow.drills.soak import plan_faults, render_confusion, soak_kinds, soak_spec
    from trainflow.preflight import preflight

    try:
        spec = load_spec(spec_path, overrides or [])
        if spec.workload.mode.value == "plain":
            raise SpecError(
                "soak: a plain script reports no steps to spread faults over; drill it one fault at a "
                "time with `trainflow drill SPEC --fault KIND --at-s SECONDS`"
            )
        try:
            wanted = [FaultKind(k.strip()) for k in kinds.split(",")] if kinds else None
        except ValueError as exc:
            raise SpecError(f"--kinds: {exc}; known: {', '.join(k.value for k in FaultKind)}") from None
        chosen, _ = soak_kinds(spec, wanted)
        soaked = soak_spec(spec, faults, chosen)
        plan_faults(soaked, faults, seed, chosen)
        preflight(spec)
    except SpecError as exc:
        fail_input(str(exc), as_json)

    with orchestrating():
        problem = quota_problem(soaked)
        if problem:
            fail_input(problem, as_json)
        from flows.soak import soak as soak_flow

        state = soak_flow(
            spec, faults, seed=seed, load=load, load_niceness=load_niceness, kinds=wanted, return_state=True
        )
    report = state.result(raise_on_failure=False)
    if isinstance(report, dict):
        typer.echo(state.message)  # the soak flow run's verdict
    else:
        report = {"faults": faults, "passed": False, "status": "crashed", "reason": str(state.message)}
        typer.echo(f"soak of {faults} faults: FAILED (the soak crashed: {state.message})")
    if "confusion" in report:
        typer.echo(render_confusion(report))
        for fault in report["per_fault"]:
            typer.echo(
                f"  {fault['kind']} at step {fault['injected_at_step']} (asked {fault['at_step']}): "
                f"{fault['detected']}, lost {fault['lost_steps']} step(s)"
            )
        typer.echo(
            f"  params match the baseline: {report['params_match_baseline']}; leftovers: "
            f"{report['leftovers'] or 'none'}; unexplained attempts: {len(report['unexplained_attempts'])}"
        )
        for kind, why in report.get("kinds_not_soaked", {}).items():
            typer.echo(f"  not soaked: {kind}: {why}")
        if report.get("load"):
            typer.echo(f"  load: {report['load']['processes']} busy loop(s) at nice {report['load']['niceness']}")
    if as_json:
        typer.echo(json.dumps(report, default=str))
    raise typer.Exit(0 if report["passed"] else EXIT_FAILED)


def print_drill(report: dict) -> None:
    from trainflow.drills.drill import phases_line

    echo = typer.echo
    echo()
    echo(f"drill {report['fault']}: {'PASSED' if report['passed'] else 'FAILED'} ({report['target']})")
    for rule in report.get("broken_rules", []):
        echo(f"  broken: {rule}")
    # a plain script reports no steps: no first step after the retry to time, no parameters to compare
    recovered = (
        "recovery not timed (no steps reported)"
        if report["recovery_s"] is None
        else f"recovered in {report['recovery_s']} s"
    )
    echo(
        f"  detected as {report['detected_kind']} after {report['detection_latency_s']} s; "
        f"{recovered} (torchrun alone: {report['torchrun_restart_s']} s)"
    )
    echo(f"  recovery phases: {phases_line(report.get('recovery_phases'))}")
    if report.get("at_s") is not None:  # a plain script: no steps, its own copies
        echo(
            f"  injected {report.get('injected_at_s')} s after launch; attempts {report['outcomes']}, resumed from "
            f"{report.get('resumed_from') or 'nothing'} (newest copy before the fault: "
            f"{report.get('newest_copy_before_fault') or 'none'})"
        )
    else:
        echo(
            f"  attempts {report['outcomes']}, resumed from step {report['resumed_from_step']}, "
            f"lost {report['lost_steps']} step(s), goodput {report['goodput']}"
        )
    sizes = report.get("world_sizes") or []
    if len(set(sizes)) > 1:  # a lost node left out, and maybe back
        echo(f"  world sizes: {' -> '.join(str(s) for s in sizes)}")
    echo(
        f"  params match the baseline: {_or_not_compared(report['params_match_baseline'])}; "
        f"resources released: {report['resources_released']}"
        + (f" (left: {'; '.join(report['leftovers'])})" if report.get("leftovers") else "")
    )


def _or_not_compared(match: bool | None) -> str:
    return "not compared" if match is None else str(match)


def register(app: typer.Typer) -> None:
    app.command()(drill)
    app.command()(soak)
