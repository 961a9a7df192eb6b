"""`trainflow` command: thin over the flows.

Exit codes: 0 success, 1 the training failed (reason printed), 2 bad input (nothing provisioned).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from trainflow.audit import VIA_CLI, launched_via
from trainflow.cli_usage import register as register_reports
from trainflow.prefect_server import (
    STARTUP_TIMEOUT_ENV, STARTUP_TIMEOUT_S, ServerError, TemporaryServer, startup_timeout_s,
)
from trainflow.cli_quota import quota_app, quota_problem
from trainflow.quota import TEMPORARY_SERVER_ENV
from trainflow.spec import SpecError, load_spec

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def trainflow() -> None:
    """Run distributed PyTorch training jobs as Prefect flows, recorded in MLflow."""


def fail_input(message: str) -> None:
    typer.echo(f"trainflow: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _stop_on_sigterm() -> None:
    """SIGTERM (a scheduler, `kill`) unwinds like Ctrl-C, so teardown still runs."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)


@contextmanager
def orchestrating():
    """Around every command that runs a flow: SIGTERM unwinds like Ctrl-C, the exit code says which
    signal stopped it, and the Prefect API outlives the flow's teardown."""
    # the temporary server's telemetry writes race the flow's own writes to its SQLite database
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # should Prefect start a temporary server of its own after all, a busy host gets time to start it
    os.environ.setdefault(STARTUP_TIMEOUT_ENV, str(STARTUP_TIMEOUT_S))
    _stop_on_sigterm()
    with _exit_on_signal(), _prefect_api(), launched_via(VIA_CLI):
        yield


@contextmanager
def _exit_on_signal():
    """A run stopped by a signal (its teardown done) exits 128 + the signal's number, saying so."""
    try:
        yield
    except BaseException as exc:
        signum = _stopping_signal(exc)
        if signum is None:
            raise
        typer.echo(f"trainflow: interrupted ({signal.Signals(signum).name})", err=True)
        raise typer.Exit(128 + signum) from None


def _stopping_signal(exc: BaseException) -> int | None:
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGTERM if str(exc) == "SIGTERM" else signal.SIGINT
    if "prefect" in sys.modules:
        from prefect.exceptions import TerminationSignal  # Prefect's own SIGTERM handler, while a flow runs

        if isinstance(exc, TerminationSignal):
            return exc.signal
    return None


@contextmanager
def _prefect_api():
    """PREFECT_API_URL's server, or a temporary one of trainflow's own: in its own session, so the
    terminal's Ctrl-C does not end it before teardown has reported; gone with this process."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    server = TemporaryServer()
    try:
        server.start(startup_timeout_s())
    except ServerError as exc:
        typer.echo(f"trainflow: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    # in the environment before prefect is imported, so every thread it starts sees this server
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ[TEMPORARY_SERVER_ENV] = "1"  # team quotas need the server the runs share
    try:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):  # if it was imported already
            yield
    finally:
        _drain_prefect_workers()
        os.environ.pop("PREFECT_API_URL", None)
        os.environ.pop(TEMPORARY_SERVER_ENV, None)
        server.stop()


def _drain_prefect_workers() -> None:
    """Prefect sends logs and events from background workers: they go before the server does."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=30)


@app.command()
def run(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Run spec (YAML).")],
    overrides: Annotated[
        Optional[list[str]], typer.Option("--set", help="Override a spec field: key.path=value (repeatable).")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest verified checkpoint.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the run summary.")] = False,
) -> None:
    """Run a training job through its whole lifecycle."""
    from trainflow.preflight import preflight

    try:
        spec = load_spec(spec_path, overrides or [])
        preflight(spec)
    except SpecError as exc:
        fail_input(str(exc))

    with orchestrating():
        from flows.lifecycle import training_lifecycle

        problem = quota_problem(spec)
        if problem:
            fail_input(problem)
        with live_progress():
            state = training_lifecycle(spec, resume=resume, return_state=True)
    finish(state, as_json)


@contextmanager
def live_progress():
    """A progress bar (step, loss, attempt, ETA) on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    from trainflow.progress import draw_while

    running = threading.Event()
    running.set()
    drawer = threading.Thread(target=draw_while, args=(running,), daemon=True)
    drawer.start()
    try:
        yield
    finally:
        running.clear()
        drawer.join(2)


def finish(state, as_json: bool) -> None:
    """Print the summary a lifecycle state carries and exit with its code."""
    summary = state.result(raise_on_failure=False)
    if not isinstance(summary, dict):
        typer.echo(f"trainflow: the lifecycle crashed: {state.message}", err=True)
        raise typer.Exit(EXIT_FAILED)
    if summary["status"] == "refused":  # a rerun whose code or environment drifted: nothing ran
        fail_input(summary["reason"])
    print_summary(summary)
    if as_json:
        from trainflow.contracts import RunSummary

        typer.echo(json.dumps(RunSummary.model_validate(summary).as_json_dict()))
    raise typer.Exit(0 if summary["status"] == "succeeded" else EXIT_FAILED)


@app.command()
def rerun(
    mlflow_run_id: Annotated[str, typer.Argument(metavar="MLFLOW_RUN_ID", help="The run to repeat.")],
    allow_drift: Annotated[
        bool, typer.Option("--allow-drift", help="Run even if code or environment differ; record the drift.")
    ] = False,
    tracking_uri: Annotated[
        Optional[str], typer.Option("--tracking-uri", help="Where the run is recorded (default: TRAINFLOW_HOME's).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the run summary.")] = False,
) -> None:
    """Repeat a recorded run with its recorded spec and seed; refuse (exit 2) if code or environment drifted."""
    from trainflow.environment import EnvironmentMismatch
    from trainflow.home import default_tracking_uri
    from trainflow.preflight import preflight
    from trainflow.rerun import RerunError, check_rerun, load_recorded_run, refusal

    tracking_uri = tracking_uri or default_tracking_uri()
    try:
        recorded = load_recorded_run(mlflow_run_id, tracking_uri)
        drift = check_rerun(recorded)
        preflight(recorded.spec)
    except (RerunError, SpecError, EnvironmentMismatch) as exc:
        fail_input(str(exc))
    if drift and not allow_drift:
        fail_input(refusal(recorded, drift))

    with orchestrating():
        from flows.rerun import rerun_training

        with live_progress():
            state = rerun_training(mlflow_run_id, allow_drift=allow_drift, tracking_uri=tracking_uri,
                                   return_state=True)
    finish(state, as_json)


app.add_typer(quota_app, name="quota")

automation_app = typer.Typer(no_args_is_help=True, help="Prefect automations for trainflow's events.")
app.add_typer(automation_app, name="automation")


@automation_app.command("install")
def automation_install(
    webhook_url: Annotated[
        Optional[str], typer.Option("--webhook-url", help="POST each failure as JSON {subject, text} to this URL.")
    ] = None,
    block: Annotated[
        Optional[str], typer.Option("--block", help="A notification block you configured, as TYPE/NAME (e.g. slack-webhook/ml-team).")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="Name of the automation (replaced if it exists).")] = "trainflow-failures",
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: what was installed.")] = False,
) -> None:
    """Notify on every failed attempt and failed run, through a webhook or a notification block."""
    from tasks.automation import AutomationError, install

    try:
        installed = install(name=name, webhook_url=webhook_url, block=block)
    except AutomationError as exc:
        fail_input(str(exc))
    typer.echo(f"automation {installed['name']} ({installed['automation_id']}) notifies through {installed['block']} "
               f"on {', '.join(installed['events'])}")
    if as_json:
        typer.echo(json.dumps(installed))


@app.command()
def render(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Run spec (YAML) with resources.backend: kubernetes.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Directory to write the manifests to.")],
    overrides: Annotated[
        Optional[list[str]], typer.Option("--set", help="Override a spec field: key.path=value (repeatable).")
    ] = None,
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run id to name the objects by.")] = None,
    attempt: Annotated[int, typer.Option("--attempt", min=1, help="Attempt number.")] = 1,
) -> None:
    """Write the Kubernetes manifests an attempt would create, for review or GitOps (no cluster needed)."""
    try:
        spec = load_spec(spec_path, overrides or [])
    except SpecError as exc:
        fail_input(str(exc))
    from trainflow.backends import launcher_for
    from trainflow.backends.abilities import RenderError, RendersManifests

    launcher = launcher_for(spec)
    if not isinstance(launcher, RendersManifests):
        fail_input(
            f"{spec_path}: resources.backend is {spec.resources.backend.value}, which has nothing to render "
            "(add --set resources.backend=kubernetes)"
        )
    try:
        written = launcher.render(spec, out, run_id, attempt)
    except RenderError as exc:
        fail_input(str(exc))
    for path in written:
        typer.echo(str(path))


@app.command()
def drill(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Run spec (YAML).")],
    fault: Annotated[str, typer.Option("--fault", help="crash, kill, hang, straggler, preempt, node-loss, "
                                       "storage-outage or corrupt-checkpoint.")],
    at_step: Annotated[int, typer.Option("--at-step", help="Inject once every rank reached this step.")] = 30,
    rank: Annotated[Optional[int], typer.Option("--rank", help="Target rank (process faults).")] = None,
    node: Annotated[Optional[int], typer.Option("--node", help="Target node (preempt, node-loss).")] = None,
    duration_s: Annotated[float, typer.Option("--duration", help="Straggler or outage length (s).")] = 8.0,
    permanent: Annotated[bool, typer.Option("--permanent", help="node-loss: the node never comes back.")] = False,
    overrides: Annotated[Optional[list[str]], typer.Option("--set", help="Override a spec field.")] = None,
    fresh_baseline: Annotated[bool, typer.Option("--fresh-baseline", help="Do not reuse a baseline.")] = False,
    compare_torchrun: Annotated[
        bool, typer.Option("--compare-torchrun/--no-compare-torchrun", help="Also time torchrun's own restart.")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the drill report.")] = False,
) -> None:
    """Inject one fault from outside into a run and report detection, recovery and exactness."""
    from pydantic import ValidationError

    from trainflow.chaos import FaultPlan
    from trainflow.drill import check_plan, drill_spec
    from trainflow.preflight import preflight

    if rank is not None and node is not None:
        fail_input("--rank and --node: give one target, not both")
    try:
        plan = FaultPlan(kind=fault, at_step=at_step, rank=rank, node=node, duration_s=duration_s, permanent=permanent)
    except ValidationError as exc:
        first = exc.errors()[0]
        fail_input(f"--{'fault' if first['loc'][0] == 'kind' else first['loc'][0]}: {first['msg']}")
    try:
        spec = load_spec(spec_path, overrides or [])
        check_plan(spec, plan)
        preflight(drill_spec(spec, plan))
    except SpecError as exc:
        fail_input(str(exc))

    with orchestrating():
        from flows.drill import fault_drill

        state = fault_drill(spec, plan, fresh_baseline=fresh_baseline, compare_torchrun=compare_torchrun,
                            return_state=True)
    report = state.result(raise_on_failure=False)
    if not isinstance(report, dict):
        typer.echo(f"trainflow: the drill crashed: {state.message}", err=True)
        if as_json:  # --json always ends with a JSON line
            typer.echo(json.dumps({"fault": plan.kind.value, "passed": False, "status": "crashed",
                                   "broken_rules": [f"the drill crashed: {state.message}"]}))
        raise typer.Exit(EXIT_FAILED)
    print_drill(report)
    if as_json:
        typer.echo(json.dumps(report, default=str))
    raise typer.Exit(0 if report["passed"] else EXIT_FAILED)


@app.command()
def soak(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Run spec (YAML).")],
    faults: Annotated[int, typer.Option("--faults", min=1, help="How many faults, of every kind in turn.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the faults' kinds, steps and ranks.")] = 0,
    load: Annotated[bool, typer.Option("--load", help="A busy loop per core beside the job for the whole soak.")] = False,
    load_niceness: Annotated[int, typer.Option("--load-niceness", min=0, max=19, help="Nice value of the busy loops.")] = 0,
    kinds: Annotated[Optional[str], typer.Option("--kinds", help="Comma-separated fault kinds (default: every kind "
                                                 "this machine and spec can soak).")] = None,
    overrides: Annotated[Optional[list[str]], typer.Option("--set", help="Override a spec field.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the soak report.")] = False,
) -> None:
    """One longer job with many faults at random steps: confusion matrix, lost steps, exactness, leftovers."""
    from trainflow.chaos import FaultKind
    from trainflow.preflight import preflight
    from trainflow.soak import plan_faults, render_confusion, soak_kinds, soak_spec

    try:
        spec = load_spec(spec_path, overrides or [])
        try:
            wanted = [FaultKind(k.strip()) for k in kinds.split(",")] if kinds else None
        except ValueError as exc:
            raise SpecError(f"--kinds: {exc}; known: {', '.join(k.value for k in FaultKind)}") from None
        chosen, _ = soak_kinds(spec, wanted)
        plan_faults(soak_spec(spec, faults, chosen), faults, seed, chosen)
        preflight(spec)
    except SpecError as exc:
        fail_input(str(exc))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.soak import soak as soak_flow

    _stop_on_sigterm()
    state = soak_flow(spec, faults, seed=seed, load=load, load_niceness=load_niceness, kinds=wanted,
                      return_state=True)
    report = state.result(raise_on_failure=False)
    if not isinstance(report, dict):
        report = {"faults": faults, "passed": False, "status": "crashed", "reason": str(state.message)}
    typer.echo(f"soak of {faults} faults: {'PASSED' if report['passed'] else 'FAILED'} ({report.get('reason')})")
    if "confusion" in report:
        typer.echo(render_confusion(report))
        for fault in report["per_fault"]:
            typer.echo(f"  {fault['kind']} at step {fault['injected_at_step']} (asked {fault['at_step']}): "
                       f"{fault['detected']}, lost {fault['lost_steps']} step(s)")
        typer.echo(f"  params match the baseline: {report['params_match_baseline']}; leftovers: "
                   f"{report['leftovers'] or 'none'}; unexplained attempts: {len(report['unexplained_attempts'])}")
        for kind, why in report.get("kinds_not_soaked", {}).items():
            typer.echo(f"  not soaked: {kind}: {why}")
        if report.get("load"):
            typer.echo(f"  load: {report['load']['processes']} busy loop(s) at nice {report['load']['niceness']}")
    if as_json:
        typer.echo(json.dumps(report, default=str))
    raise typer.Exit(0 if report["passed"] else EXIT_FAILED)


def print_drill(report: dict) -> None:
    from trainflow.drill import phases_line

    echo = typer.echo
    echo()
    echo(f"drill {report['fault']}: {'PASSED' if report['passed'] else 'FAILED'} ({report['target']})")
    for rule in report.get("broken_rules", []):
        echo(f"  broken: {rule}")
    echo(f"  detected as {report['detected_kind']} after {report['detection_latency_s']} s; "
         f"recovered in {report['recovery_s']} s (torchrun alone: {report['torchrun_restart_s']} s)")
    echo(f"  recovery phases: {phases_line(report.get('recovery_phases'))}")
    echo(f"  attempts {report['outcomes']}, resumed from step {report['resumed_from_step']}, "
         f"lost {report['lost_steps']} step(s), goodput {report['goodput']}")
    echo(f"  params match the baseline: {report['params_match_baseline']}; "
         f"resources released: {report['resources_released']}")


def print_summary(summary: dict) -> None:
    from trainflow.summary import closing_lines

    typer.echo()
    for line in closing_lines(summary, _prefect_ui_url()):
        typer.echo(line)


def _prefect_ui_url() -> str | None:
    """The UI of the Prefect server named by PREFECT_API_URL; None when the run had a temporary one."""
    if not os.environ.get("PREFECT_API_URL"):
        return None
    from prefect.settings import PREFECT_UI_URL

    return PREFECT_UI_URL.value()


bench_app = typer.Typer(no_args_is_help=True, help="Measure trainflow's parts on this machine.")
app.add_typer(bench_app, name="bench")


@bench_app.command("checkpoint")
def bench_checkpoint(
    size_mb: Annotated[int, typer.Option("--size-mb", help="Checkpoint size (parameters + momentum), MiB.")] = 64,
    uri: Annotated[
        Optional[str], typer.Option("--uri", help="s3://bucket/prefix to use (default: start an own moto_server).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="End with one JSON line: the figures.")] = False,
) -> None:
    """Stall of sync vs async saves, local/S3 throughput vs plain boto3, verify time, step overhead."""
    from trainflow.bench.checkpoint import BenchError, Options, render, run_benchmark

    try:
        figures = run_benchmark(Options(size_mb=size_mb, uri=uri), log=lambda text: typer.echo(text, err=True))
    except BenchError as exc:
        fail_input(str(exc))
    typer.echo(render(figures))
    if as_json:
        typer.echo(json.dumps(figures))


register_reports(app)  # trainflow usage, trainflow audit


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("trainflow: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
