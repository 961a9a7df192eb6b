"""Team quotas on the session's Prefect server: a team's runs hold its devices from before provision
until after teardown, a run that would exceed the team's limit waits (and says so), another team
is not held up, and every slot comes back: after success, failure, SIGTERM, a dead orchestrator and
a restarted server (on a server of the test's own); what runs that no longer exist hold is shown and
given back by `trainflow quota repair`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.integration.conftest import BIN, run_cli, start_server, summary_of
from tests.integration.deployments import api_json
from trainflow.backends.ports import free_port
from trainflow.drills.servers import stop_server

pytestmark = pytest.mark.integration

SPEC = "examples/digits/spec.yaml"  # 2 nodes x 1 process: 2 devices
SHORT = ["--set", "workload.steps=12", "--set", "checkpoint.every_steps=6"]
PAUSE_AT_STEP = 4
DEADLINE_S = 300  # generous: the machine is shared; nothing here measures time


def team_name(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:6]}"


def team_args(team: str) -> list[str]:
    return ["--set", f"tracking.tags={{team: {team}}}"]


def held(cli_env: dict, team: str) -> int:
    """The devices the team's runs hold, as `trainflow quota list` shows them."""
    result = run_cli(["quota", "list", "--json"], cli_env)
    assert result.returncode == 0, result.stderr
    return next(row["held"] for row in json.loads(result.stdout) if row["team"] == team)


def held_on_server(api: str, team: str) -> int:
    """The devices the team's runs hold, read from the Prefect server itself (no CLI start-up)."""
    return api_json(api, "GET", f"/v2/concurrency_limits/trainflow-team-{team}")["active_slots"]


def start_run(cli_env: dict, log_dir: Path, name: str, *args: str) -> subprocess.Popen:
    """`trainflow run --json` in the background, its output to log_dir/name.{out,err}."""
    with open(log_dir / f"{name}.out", "wb") as out, open(log_dir / f"{name}.err", "wb") as err:
        proc = subprocess.Popen(
            [str(BIN / "trainflow"), "run", SPEC, *args, "--json"],
            env=cli_env,
            cwd=ROOT,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    proc.log_dir, proc.name = log_dir, name
    return proc


def paused_args(gate: Path) -> list[str]:
    """A run that stops at PAUSE_AT_STEP, holding its quota, until `gate/release` exists."""
    gate.mkdir(parents=True, exist_ok=True)
    return [
        "--set",
        "workload.entrypoint=tests/integration/workloads/pause_until_released.py",
        "--set",
        f"workload.args=[--pause-at-step, '{PAUSE_AT_STEP}', --paused, '{gate / 'paused'}', "
        f"--release, '{gate / 'release'}']",
        "--set",
        "fault_tolerance.hang_timeout_s=900",
        *SHORT,
    ]


def wait_until(condition, what: str, procs: list[subprocess.Popen] = ()) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        for proc in procs:
            assert proc.poll() is None, f"{proc.name} ended early while waiting for {what}:\n{stderr_of(proc)[-3000:]}"
        assert time.monotonic() < deadline, f"not seen within {DEADLINE_S} s: {what}"
        time.sleep(0.3)


def stderr_of(proc: subprocess.Popen) -> str:
    return (proc.log_dir / f"{proc.name}.err").read_text(errors="replace")


def finished(proc: subprocess.Popen) -> tuple[int, dict | None, str]:
    code = proc.wait(DEADLINE_S)
    result = subprocess.CompletedProcess(
        proc.args, code, (proc.log_dir / f"{proc.name}.out").read_text(), stderr_of(proc)
    )
    return code, summary_of(result) if code in (0, 1) else None, result.stdout + result.stderr


def quota_task_times(api: str, flow_run_id: str) -> tuple[str, str]:
    """(end of `wait-for-quota`, start of `release-quota`) of one flow run, from the Prefect server."""
    runs = api_json(api, "POST", "/task_runs/filter", {"task_runs": {"flow_run_id": {"any_": [flow_run_id]}}})
    by_name = {run["name"]: run for run in runs}  # task runs are named after their stage
    return by_name["wait-for-quota"]["end_time"], by_name["release-quota"]["start_time"]


@pytest.fixture
def kill_on_exit():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:  # a failed assertion must not leave a run behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(120)


def test_quota_set_list_delete_and_bad_input(cli_env):
    team = team_name("cli")
    assert run_cli(["quota", "set", team, "--devices", "3"], cli_env).returncode == 0
    rows = json.loads(run_cli(["quota", "list", "--json"], cli_env).stdout)
    assert {
        "team": team,
        "limit": f"trainflow-team-{team}",
        "devices": 3,
        "held": 0,
        "stale": 0,
        "active": True,
    } in rows
    assert run_cli(["quota", "set", team, "--devices", "5"], cli_env).returncode == 0
    assert f"trainflow-team-{team}" in run_cli(["quota", "list"], cli_env).stdout
    assert held(cli_env, team) == 0
    too_big = run_cli(["run", SPEC, *team_args(team), "--set", "resources.nodes=6"], cli_env)
    assert too_big.returncode == 2
    assert too_big.stderr.strip().splitlines()[-1].startswith("trainflow: resources: the run needs 6 devices")
    too_big_drill = run_cli(
        ["drill", SPEC, "--fault", "crash", *team_args(team), "--set", "resources.nodes=6"], cli_env
    )
    assert too_big_drill.returncode == 2, too_big_drill.stderr[-2000:]
    assert too_big_drill.stderr.strip().splitlines()[-1].startswith("trainflow: resources: the run needs 6 devices")
    too_big_soak = run_cli(
        ["soak", SPEC, "--faults", "1", "--kinds", "crash", *team_args(team), "--set", "resources.nodes=6"], cli_env
    )
    assert too_big_soak.returncode == 2, too_big_soak.stderr[-2000:]
    assert too_big_soak.stderr.strip().splitlines()[-1].startswith("trainflow: resources: the run needs 6 devices")
    assert run_cli(["quota", "delete", team], cli_env).returncode == 0
    gone = run_cli(["quota", "delete", team], cli_env)
    assert gone.returncode == 2 and "no such quota" in gone.stderr
    bad = run_cli(["quota", "set", team, "--devices", "0"], cli_env)
    assert bad.returncode == 2 and "--devices" in bad.stderr
    no_server = run_cli(["quota", "list"], {k: v for k, v in cli_env.items() if k != "PREFECT_API_URL"})
    assert no_server.returncode == 2 and "PREFECT_API_URL" in no_server.stderr


@pytest.mark.timeout(900)  # four runs, three of them one after another, on a shared 2-core machine
def test_a_teams_runs_queue_for_its_quota_while_another_team_runs(cli_env, prefect_api, tmp_path, kill_on_exit):
    vision, speech = team_name("vision"), team_name("speech")
    for team in (vision, speech):
        assert run_cli(["quota", "set", team, "--devices", "2"], cli_env).returncode == 0
    gate = tmp_path / "gate"
    first = start_run(cli_env, tmp_path, "first", *team_args(vision), *paused_args(gate))
    kill_on_exit.append(first)
    wait_until((gate / "paused").exists, "the first run training", [first])
    second = start_run(cli_env, tmp_path, "second", *team_args(vision), *SHORT)
    third = start_run(cli_env, tmp_path, "third", *team_args(vision), *SHORT)
    kill_on_exit += [second, third]
    for queued in (second, third):
        wait_until(
            lambda queued=queued: f"queued for quota trainflow-team-{vision}" in stderr_of(queued),
            f"{queued.name} queued",
            [first, queued],
        )

    # the other team runs to the end while all of vision's devices are held
    other = run_cli(["run", SPEC, *team_args(speech), *SHORT, "--json"], cli_env, timeout_s=DEADLINE_S)
    assert other.returncode == 0, other.stderr[-3000:]
    assert summary_of(other)["quota"]["limit"] == f"trainflow-team-{speech}"
    assert "queued for quota" not in other.stdout + other.stderr
    assert second.poll() is None and third.poll() is None and held_on_server(prefect_api, vision) == 2

    (gate / "release").touch()
    results = {proc.name: finished(proc) for proc in (first, second, third)}
    for name, (code, summary, output) in results.items():
        assert code == 0, f"{name}:\n{output[-3000:]}"
        assert summary["quota"] == {**summary["quota"], "limit": f"trainflow-team-{vision}", "devices": 2}
    for name in ("second", "third"):
        output = results[name][2]
        assert f"queued for quota trainflow-team-{vision}: needs 2 devices, 2/2 held, waited" in output
        summary = results[name][1]
        metric = MlflowClient(summary["tracking_uri"]).get_run(summary["mlflow_run_id"]).data.metrics
        assert metric["quota_wait_s"] == pytest.approx(summary["quota"]["waited_s"], abs=0.1)
        assert metric["quota_wait_s"] > 0

    # one at a time: each run took the devices only after the one before gave them back
    spans = sorted(quota_task_times(prefect_api, summary["prefect_flow_run_id"]) for _, summary, _ in results.values())
    for (_, released), (acquired, _) in zip(spans, spans[1:]):
        assert acquired >= released, spans
    assert held(cli_env, vision) == 0 and held(cli_env, speech) == 0


@pytest.mark.timeout(900)  # four runs, two of them holding the quota at once
def test_slots_come_back_after_failure_sigterm_and_a_dead_orchestrator(cli_env, prefect_api, tmp_path, kill_on_exit):
    team = team_name("robotics")
    assert run_cli(["quota", "set", team, "--devices", "4"], cli_env).returncode == 0  # two runs at once

    running: list[subprocess.Popen] = []
    for name in ("stopped", "dead"):  # one after the other: the first one creates the home's MLflow store
        running.append(start_run(cli_env, tmp_path, name, *team_args(team), *paused_args(tmp_path / name)))
        kill_on_exit.append(running[-1])
        wait_until((tmp_path / name / "paused").exists, f"{name} training", running)
    stopped, dead = running
    assert held_on_server(prefect_api, team) == 4
    queued = start_run(cli_env, tmp_path, "queued", *team_args(team), *SHORT)
    kill_on_exit.append(queued)
    wait_until(
        lambda: f"queued for quota trainflow-team-{team}: needs 2 devices, 4/4 held" in stderr_of(queued),
        "the queued run",
        [queued],
    )
    for proc in (queued, stopped):  # SIGTERM: what a Prefect worker sends a flow run it cancels
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(DEADLINE_S) == 128 + signal.SIGTERM
        assert held_on_server(prefect_api, team) == (4 if proc is queued else 2)  # the queued run took nothing

    os.kill(dead.pid, signal.SIGKILL)  # the orchestrator alone: nothing gives its devices back
    dead.wait(30)
    assert held_on_server(prefect_api, team) == 2
    assert run_cli(["quota", "set", team, "--devices", "2"], cli_env).returncode == 0  # the next run needs them
    # the next run takes the dead run's devices back, then fails: its own come back too
    failed = run_cli(
        [
            "run",
            SPEC,
            *team_args(team),
            *SHORT,
            "--json",
            "--set",
            "workload.entrypoint=tests/integration/workloads/exit_at_step.py",
            "--set",
            "workload.args=[--exit-at-step, '3']",
            "--set",
            "fault_tolerance.max_restarts=0",
        ],
        cli_env,
        timeout_s=DEADLINE_S,
    )
    assert failed.returncode == 1 and summary_of(failed)["status"] == "failed", failed.stderr[-3000:]
    assert f"quota trainflow-team-{team}: gave back 2 devices of run" in failed.stderr
    assert "queued for quota" not in failed.stderr
    assert held_on_server(prefect_api, team) == 0 and held(cli_env, team) == 0
    assert not list((Path(cli_env["TRAINFLOW_HOME"]) / "quota").glob("*.json"))


@pytest.fixture
def own_prefect_server(tmp_path):
    """A Prefect server of this test alone (the session's is shared), which the test may kill and start again."""
    home, port = tmp_path / "prefect-home", free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
    }
    env.pop("PREFECT_API_URL", None)
    api = f"http://127.0.0.1:{port}/api"
    home.mkdir()
    servers: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        servers.append(
            start_server(
                [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env,
                home / f"server-{len(servers)}.log",
                f"{api}/health",
                timeout_s=DEADLINE_S,
            )
        )
        return servers[-1]

    start()
    yield api, start, servers
    for server in servers:
        stop_server(server)


def test_a_server_restart_never_leaks_a_teams_quota(cli_env, own_prefect_server, tmp_path, kill_on_exit):
    api, start_again, servers = own_prefect_server
    env = {**cli_env, "PREFECT_API_URL": api}
    assert run_cli(["quota", "set", "default", "--devices", "2"], env).returncode == 0
    run = start_run(env, tmp_path, "restarted", *paused_args(tmp_path / "gate"))
    kill_on_exit.append(run)
    wait_until((tmp_path / "gate" / "paused").exists, "training", [run])
    assert held_on_server(api, "default") == 2

    os.killpg(servers[-1].pid, signal.SIGKILL)  # the server forgets its leases, not the slots they took
    servers[-1].wait(30)
    start_again()
    assert held_on_server(api, "default") == 2
    (tmp_path / "gate" / "release").touch()
    code, summary, output = finished(run)
    assert code == 0 and summary["status"] == "succeeded", output[-4000:]
    assert "devices given back" in output
    assert held_on_server(api, "default") == 0  # what the log says happened, happened
    rows = json.loads(run_cli(["quota", "list", "--json"], env).stdout)
    assert [(row["team"], row["held"], row["stale"]) for row in rows] == [("default", 0, 0)]


def test_quota_shows_and_repairs_devices_held_by_runs_that_no_longer_exist(cli_env, own_prefect_server):
    api, _, _ = own_prefect_server
    env = {**cli_env, "PREFECT_API_URL": api}
    team = team_name("stale")
    assert run_cli(["quota", "set", team, "--devices", "4"], env).returncode == 0
    # slots taken without a lease, as a server that lost its leases in a restart still counts them
    api_json(
        api,
        "POST",
        "/v2/concurrency_limits/increment",
        {"names": [f"trainflow-team-{team}"], "slots": 3, "mode": "concurrency"},
    )
    listed = run_cli(["quota", "list"], env)
    assert listed.returncode == 0 and "held by runs that no longer exist" in listed.stdout, listed.stdout
    rows = json.loads(run_cli(["quota", "list", "--json"], env).stdout)
    assert [(row["held"], row["stale"]) for row in rows if row["team"] == team] == [(3, 3)]

    repaired = run_cli(["quota", "repair", team], env)
    assert repaired.returncode == 0, repaired.stderr
    assert f"quota trainflow-team-{team}: gave back 3 of 3 held devices (its runs hold 0)" in repaired.stdout
    assert held_on_server(api, team) == 0
    again = run_cli(["quota", "repair"], env)
    assert again.returncode == 0 and "nothing to repair" in again.stdout
    assert run_cli(["quota", "repair", "no-such-team"], env).returncode == 2
