"""The checkpoint engine on real parts: torchrun workers talking gloo, a real S3 endpoint (moto on
loopback), the orchestrator's real status channel. No Prefect here: each test tells the runtime
exactly where to restore from, as the lifecycle would, and looks at every event it reports.

- torn checkpoints (no manifest, a truncated shard, a wrong checksum, a missing file) are never
  loaded and the previous one is; neither is one whose `.metadata` points outside the checkpoint
  or whose JSON state is malformed, even with a manifest rewritten to match;
- a checkpoint saved by 2 processes restores into 1 and into 4;
- the node-local tier is used when it verifies (gathered across nodes), S3 otherwise;
- the S3 endpoint going away mid-upload commits nothing, and training goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import BUCKET, s3_environment, unique_prefix
from trainflow.backends.ports import free_port
from trainflow.checkpoint.catalog import step_of
from trainflow.checkpoint.dcp_io import load_metadata
from trainflow.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest
from trainflow.orchestrator.status import StatusServer
from trainflow.worker_config import CONFIG_ENV, JOB_ENV, WorkerConfig, fault_gate_path

pytestmark = pytest.mark.integration

WORKLOAD = "examples/digits/train.py"


@dataclass
class Attempt:
    returncodes: list[int]
    events: list[dict]
    logs: list[str]

    def of(self, kind: str, **match) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]

    @property
    def restored(self) -> dict | None:
        found = self.of("restored", rank=0)
        return found[0] if found else None

    @property
    def finished(self) -> dict | None:
        found = self.of("finished")
        return found[0] if found else None

    def explain(self) -> str:
        return f"exit codes {self.returncodes}\n" + "\n".join(log[-3000:] for log in self.logs)


@dataclass
class Job:
    """One job (run id, node scratch folders that persist across its attempts, a checkpoint URI)."""

    run_id: str
    home: Path
    uri: str
    env: dict[str, str]
    nodes: int = 2
    procs_per_node: int = 1
    every_steps: int = 10
    snapshot_every_s: float = 0.0
    local_tier: bool = True
    args: list[str] = field(default_factory=list)
    pause_at_step: int | None = None  # every rank waits there until the fault gate (under home/run id) opens
    attempts: int = 0

    def scratch(self, node: int) -> Path:
        return self.home / self.run_id / f"node-{node}"

    def run(
        self,
        steps: int,
        restore_prefix: str | None = None,
        timeout_s: float = 240,
        nodes: int | None = None,
        procs_per_node: int | None = None,
        during=None,
    ) -> Attempt:
        """Run one attempt to its end; `during(channel)` runs alongside it (to inject a fault)."""
        nodes = nodes or self.nodes
        procs = procs_per_node or self.procs_per_node
        self.attempts += 1
        channel = StatusServer()
        channel.begin_attempt(self.attempts)
        port = free_port()
        folder = self.home / self.run_id / f"attempt-{self.attempts}"
        folder.mkdir(parents=True, exist_ok=True)
        procs_started, logs = [], []
        try:
            for node in range(nodes):
                config = WorkerConfig(
                    run_id=self.run_id,
                    attempt=self.attempts,
                    node=node,
                    status_address=channel.address,
                    status_token=channel.token,
                    checkpoint_uri=self.uri,
                    every_steps=self.every_steps,
                    total_steps=steps,
                    seed=1234,
                    spec_hash="0" * 64,
                    code_version="test",
                    comm_backend="gloo",
                    collective_timeout_s=120,
                    heartbeat_interval_s=1.0,
                    orchestrator_timeout_s=120,
                    node_scratch=str(self.scratch(node)),
                    restore_prefix=restore_prefix,
                    snapshot_every_s=self.snapshot_every_s,
                    local_tier=self.local_tier,
                    pause_at_steps=(self.pause_at_step,) if self.pause_at_step else (),
                    fault_gate=str(fault_gate_path(folder.parent, self.attempts)) if self.pause_at_step else None,
                )
                path = config.write(folder / f"node-{node}.json")
                log = folder / f"node-{node}.log"
                logs.append(log)
                command = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes",
                    str(nodes),
                    "--nproc-per-node",
                    str(procs),
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"127.0.0.1:{port}",
                    "--rdzv-id",
                    f"{self.run_id}-{self.attempts}",
                    "--rdzv-conf",
                    f"is_host={'true' if node == 0 else 'false'}",
                    "--max-restarts",
                    "0",
                    "--monitor-interval",
                    "0.1",
                    "--local-addr",
                    "127.0.0.1",
                    "--log-dir",
                    str(folder / "torchrun" / f"node-{node}"),
                    WORKLOAD,
                    *self.args,
                ]
                env = {
                    **self.env,
                    CONFIG_ENV: str(path),
                    JOB_ENV: self.run_id,
                    "OMP_NUM_THREADS": "1",
                    "PYTHONUNBUFFERED": "1",
                }
                with open(log, "wb") as out:
                    procs_started.append(
                        subprocess.Popen(
                            command,
                            cwd=ROOT,
                            env=env,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
            worker = threading.Thread(target=during, args=(channel,), daemon=True) if during else None
            if worker:
                worker.start()
            deadline = time.monotonic() + timeout_s
            while any(p.poll() is None for p in procs_started) and time.monotonic() < deadline:
                time.sleep(0.1)
            if worker:
                worker.join(30)
        finally:
            for proc in procs_started:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait()
            time.sleep(0.2)  # the last messages in flight
            events = []
            while True:
                try:
                    events.append(channel.events.get_nowait().as_dict())
                except queue.Empty:
                    break
            channel.close()
        return Attempt([p.returncode for p in procs_started], events, [log.read_text(errors="replace") for log in logs])


class ThrottledProxy:
    """A TCP relay in front of the S3 endpoint: uploads go through at `rate` bytes/s (so a checkpoint
    takes a while to upload), and `stop()` makes the endpoint vanish — connections cut, new ones
    refused — until `start()`."""

    def __init__(self, target_port: int, rate: float):
        self.target = ("127.0.0.1", target_port)
        self.rate = rate
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.start()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            doomed, self._sockets = self._sockets, set()
        for sock in doomed:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, throttled: bool) -> None:
        try:
            while data := source.recv(16384):
                if throttled:
                    time.sleep(len(data) / self.rate)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            source.close()


# ---- fixtures and helpers ----------------------------------------------------------------------


def worker_env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, **s3_environment(endpoint), **extra}
    env.pop("AWS_PROFILE", None)
    return env


def new_job(home: Path, uri: str, env: dict, **options) -> Job:
    return Job(run_id=f"ckpt-{uuid.uuid4().hex[:8]}", home=home, uri=uri, env=env, **options)


def key_prefix(uri: str) -> str:
    return uri.removeprefix(f"s3://{BUCKET}/")


def committed_steps(s3, uri: str, run_id: str) -> set[int]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{key_prefix(uri)}/{run_id}/")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    return {step_of(key) for key in keys if key.endswith("/manifest.json")}


def local_file(job: Job, node: int, step: int, name: str) -> Path:
    return sorted((job.scratch(node) / "checkpoints" / job.run_id).glob(f"step-{step:08d}-*"))[-1] / name


def local_files(job: Job, node: int, step: int) -> set[str]:
    folders = sorted((job.scratch(node) / "checkpoints" / job.run_id).glob(f"step-{step:08d}-*"))
    assert folders, f"node {node} holds no local checkpoint of step {step}"
    return {p.name for p in folders[-1].iterdir()}


@dataclass
class Saved:
    job: Job
    attempt: Attempt

    @property
    def params(self) -> str:
        return self.attempt.finished["params_sha256"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, s3_endpoint) -> Saved:
    """One uninterrupted 50-step run of the reference workload on 2 nodes, a snapshot every 10 steps."""
    job = new_job(tmp_path_factory.mktemp("saved"), unique_prefix(), worker_env(s3_endpoint))
    attempt = job.run(steps=50)
    assert attempt.returncodes == [0, 0], attempt.explain()
    assert sorted(e["step"] for e in attempt.of("checkpoint", status="committed")) == [10, 20, 30, 40, 50]
    return Saved(job, attempt)


# ---- the tests ---------------------------------------------------------------------------------


def test_torn_checkpoints_are_never_loaded_and_the_previous_one_is(saved, s3, s3_endpoint, tmp_path):
    uri, run = unique_prefix(), saved.job.run_id
    source, target = f"{key_prefix(saved.job.uri)}/{run}/", f"{key_prefix(uri)}/{run}/"
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=source):
        for obj in page.get("Contents", []):
            s3.copy_object(
                Bucket=BUCKET, Key=target + obj["Key"][len(source) :], CopySource={"Bucket": BUCKET, "Key": obj["Key"]}
            )

    def key(step: int, name: str) -> str:
        return f"{target}step-{step:08d}/{name}"

    def body(step: int, name: str) -> bytes:
        return s3.get_object(Bucket=BUCKET, Key=key(step, name))["Body"].read()

    s3.delete_object(Bucket=BUCKET, Key=key(50, "manifest.json"))  # never committed
    s3.put_object(Bucket=BUCKET, Key=key(40, "__0_0.distcp"), Body=body(40, "__0_0.distcp")[:-100])  # truncated
    flipped = bytearray(body(30, "__1_0.distcp"))
    flipped[len(flipped) // 2] ^= 0xFF
    s3.put_object(Bucket=BUCKET, Key=key(30, "__1_0.distcp"), Body=bytes(flipped))  # same size, wrong checksum
    s3.delete_object(Bucket=BUCKET, Key=key(20, "rank-1.json"))  # a missing file

    attempt = new_job(tmp_path, uri, worker_env(s3_endpoint)).run(steps=50, restore_prefix=f"{run}/step-00000050")
    assert attempt.returncodes == [0, 0], attempt.explain()
    assert attempt.restored["step"] == 10 and attempt.restored["tier"] == "durable"
    rejected = {e["step"]: e["reason"] for e in attempt.of("checkpoint", status="rejected")}
    assert sorted(rejected) == [20, 30, 40, 50]
    assert "manifest" in rejected[50]
    assert "__0_0.distcp: size" in rejected[40]
    assert "__1_0.distcp: sha256 mismatch" in rejected[30]
    assert "rank-1.json: missing" in rejected[20]
    assert len(attempt.restored["fallbacks"]) == 4
    # what was loaded is exactly step 10: training on from it ends where the uninterrupted run did
    assert attempt.finished["params_sha256"] == saved.params


class CopiedRun:
    """The saved run's checkpoints copied under a fresh URI, to be tampered with there."""

    def __init__(self, s3, saved: Saved):
        self.s3, self.uri, self.run = s3, unique_prefix(), saved.job.run_id
        source, self.target = f"{key_prefix(saved.job.uri)}/{self.run}/", f"{key_prefix(self.uri)}/{self.run}/"
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=source):
            for obj in page.get("Contents", []):
                s3.copy_object(
                    Bucket=BUCKET,
                    Key=self.target + obj["Key"][len(source) :],
                    CopySource={"Bucket": BUCKET, "Key": obj["Key"]},
                )

    def key(self, step: int, name: str) -> str:
        return f"{self.target}step-{step:08d}/{name}"

    def body(self, step: int, name: str) -> bytes:
        return self.s3.get_object(Bucket=BUCKET, Key=self.key(step, name))["Body"].read()

    def rewrite(self, step: int, name: str, data: bytes) -> None:
        """Replace one file and give the manifest its new size and sha256: a hash-consistent forgery."""
        manifest = Manifest.from_json(self.body(step, MANIFEST_NAME))
        files = tuple(
            FileEntry(e.name, len(data), hashlib.sha256(data).hexdigest()) if e.name == name else e
            for e in manifest.files
        )
        self.s3.put_object(Bucket=BUCKET, Key=self.key(step, name), Body=data)
        self.s3.put_object(
            Bucket=BUCKET, Key=self.key(step, MANIFEST_NAME), Body=replace(manifest, files=files).to_json().encode()
        )


def test_a_metadata_pointing_outside_the_checkpoint_is_refused(saved, s3, s3_endpoint, tmp_path):
    copied = CopiedRun(s3, saved)
    # step 50's .metadata sends its rank-0 shard reads to a file outside the checkpoint (a copy of
    # that very shard, so DCP would load it without a complaint); the manifest is rewritten to match
    outside = tmp_path / "outside.distcp"
    outside.write_bytes(copied.body(50, "__0_0.distcp"))
    (tmp_path / "tampered.metadata").write_bytes(copied.body(50, ".metadata"))
    metadata = load_metadata(tmp_path / "tampered.metadata")
    for info in metadata.storage_data.values():
        if info.relative_path == "__0_0.distcp":
            info.relative_path = str(outside)
    copied.rewrite(50, ".metadata", pickle.dumps(metadata))

    attempt = new_job(tmp_path / "job", copied.uri, worker_env(s3_endpoint)).run(
        steps=50, restore_prefix=f"{copied.run}/step-00000050"
    )
    assert attempt.returncodes == [0, 0], attempt.explain()
    assert attempt.restored["step"] == 40 and attempt.restored["tier"] == "durable"
    rejected = {e["step"]: e["reason"] for e in attempt.of("checkpoint", status="rejected")}
    assert list(rejected) == [50]
    assert ".metadata: names files outside the manifest" in rejected[50] and str(outside) in rejected[50]
    assert any("step 50" in f and "outside the manifest" in f for f in attempt.restored["fallbacks"])
    assert any("not restoring the durable checkpoint of step 50" in log for log in attempt.logs)
    assert attempt.finished["params_sha256"] == saved.params  # step 40, trained on to 50


def test_hash_consistent_but_malformed_state_falls_back_to_the_previous_checkpoint(saved, s3, s3_endpoint, tmp_path):
    copied = CopiedRun(s3, saved)
    copied.rewrite(50, "state.json", b'{"model": {"weight": ')  # not JSON
    # valid JSON of the wrong shape, and in one rank's file only: every rank must move on together
    copied.rewrite(40, "rank-1.json", json.dumps({"step": 40, "rng": {"python": 3}, "extras": {}}).encode())

    attempt = new_job(tmp_path, copied.uri, worker_env(s3_endpoint)).run(
        steps=50, restore_prefix=f"{copied.run}/step-00000050"
    )
    assert attempt.returncodes == [0, 0], attempt.explain()
    assert attempt.restored["step"] == 30 and attempt.restored["tier"] == "durable"
    rejected = {e["step"]: e["reason"] for e in attempt.of("checkpoint", status="rejected")}
    assert sorted(rejected) == [40, 50]
    assert "state.json: not JSON" in rejected[50]
    assert "rank-1.json: RNG state" in rejected[40]
    assert [f.split(" (")[0] for f in attempt.restored["fallbacks"]] == ["durable step 50", "durable step 40"]
    assert attempt.finished["params_sha256"] == saved.params


@pytest.mark.parametrize("procs", [1, 4], ids=["into-1", "into-4"])
def test_a_checkpoint_of_two_processes_restores_into_one_and_into_four(saved, s3_endpoint, tmp_path, procs):
    job = new_job(tmp_path, saved.job.uri, worker_env(s3_endpoint), nodes=1, procs_per_node=procs)
    attempt = job.run(steps=50, restore_prefix=f"{saved.job.run_id}/step-00000050")
    assert attempt.returncodes == [0], attempt.explain()
    assert len(attempt.of("restored")) == procs and all(e["step"] == 50 for e in attempt.of("restored"))
    assert attempt.finished["params_sha256"] == saved.params  # every parameter, bit for bit


def test_local_tier_is_used_when_valid_and_s3_otherwise(saved, s3, s3_endpoint, tmp_path):
    job = new_job(tmp_path, unique_prefix(), worker_env(s3_endpoint), snapshot_every_s=3600)
    first = job.run(steps=30)
    assert first.returncodes == [0, 0], first.explain()
    # snapshots: the first checkpoint of the attempt and the last step; the local tier has 20 and 30
    assert committed_steps(s3, job.uri, job.run_id) == {10, 30}
    # each node holds its own ranks' files and, as the other's buddy, the other node's
    assert {"__0_0.distcp", "__1_0.distcp"} <= local_files(job, 0, 20) == local_files(job, 1, 20)

    # node 1 lost its own shard of step 30; the orchestrator only knows S3's older step 10: the nodes
    # together hold a verified step 30, node 1 gets its shard back from its buddy
    local_file(job, 1, 30, "__1_0.distcp").unlink()
    second = job.run(steps=40, restore_prefix=f"{job.run_id}/step-00000010")
    assert second.returncodes == [0, 0], second.explain()
    assert second.restored["step"] == 30 and second.restored["tier"] == "local"
    assert local_files(job, 0, 30) == local_files(job, 1, 30)  # each node got what it lacked

    # node 1's shard of step 40 is damaged on both nodes that hold it: S3's copy is used
    for node in (0, 1):
        damaged = local_file(job, node, 40, "__1_0.distcp")
        data = bytearray(damaged.read_bytes())
        data[len(data) // 2] ^= 0xFF
        damaged.write_bytes(bytes(data))
    third = job.run(steps=50, restore_prefix=f"{job.run_id}/step-00000040")
    assert third.returncodes == [0, 0], third.explain()
    assert third.restored["step"] == 40 and third.restored["tier"] == "durable"
    assert any("local" in f and "__1_0.distcp: sha256 mismatch" in f for f in third.restored["fallbacks"])
    # two restores, from either tier, and not a bit differs from the run that never stopped
    assert third.finished["params_sha256"] == saved.params


def test_without_a_local_tier_every_checkpoint_is_a_snapshot_and_restores_read_s3(s3, s3_endpoint, tmp_path):
    job = new_job(tmp_path, unique_prefix(), worker_env(s3_endpoint), snapshot_every_s=3600, local_tier=False)
    first = job.run(steps=30)
    assert first.returncodes == [0, 0], first.explain()
    assert committed_steps(s3, job.uri, job.run_id) == {10, 20, 30}  # snapshot_every_s does not apply
    second = job.run(steps=30, restore_prefix=f"{job.run_id}/step-00000030")
    assert second.returncodes == [0, 0], second.explain()
    assert second.restored["step"] == 30 and second.restored["tier"] == "durable"


def reported_failed(channel: StatusServer, step: int) -> bool:
    with channel.events.mutex:  # a look at the queue, leaving its events for the attempt's record
        pending = [e.as_dict() for e in channel.events.queue]
    return any(e["kind"] == "checkpoint" and e.get("status") == "failed" and e["step"] == step for e in pending)


def test_s3_endpoint_stopping_mid_upload_commits_nothing_and_training_continues(s3, s3_endpoint, tmp_path):
    proxy = ThrottledProxy(int(s3_endpoint.rsplit(":", 1)[1]), rate=2e6)
    env = worker_env(f"http://127.0.0.1:{proxy.port}", TRAINFLOW_S3_UPLOAD_PART_MB="1")  # multipart, slowly
    job = new_job(tmp_path, unique_prefix(), env, args=["--hidden", "512"])
    interrupted: dict = {}

    def outage(channel) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            uploads = s3.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{key_prefix(job.uri)}/{job.run_id}/")
            if uploads.get("Uploads"):
                interrupted["step"] = step_of(uploads["Uploads"][0]["Key"])
                proxy.stop()
                # down until the save has given up (the client retries first), then back
                while time.monotonic() < deadline and not reported_failed(channel, interrupted["step"]):
                    time.sleep(0.05)
                proxy.start()
                return
            time.sleep(0.02)

    try:
        attempt = job.run(steps=100, during=outage)
    finally:
        proxy.stop()
    assert attempt.returncodes == [0, 0], attempt.explain()
    assert attempt.finished["step"] == 100  # training went on
    step = interrupted["step"]
    failed = {e["step"]: e["reason"] for e in attempt.of("checkpoint", status="failed")}
    assert step in failed, (step, failed)
    committed = committed_steps(s3, job.uri, job.run_id)
    assert step not in committed and 100 in committed
    assert not set(failed) & committed
    # the multipart uploads the outage cut short were aborted once the endpoint was back
    left = s3.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{key_prefix(job.uri)}/{job.run_id}/").get("Uploads", [])
    assert left == []
