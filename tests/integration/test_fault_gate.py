"""A drill's fault lands only once every rank has finished the save before its step's own: the
checkpoint the drill verdict calls "committed before the fault" is in the store when it goes in.

The race it guards against: a rank reports a checkpoint step before that step's save waits for
the previous one, so "every rank reached step N" says nothing of the save of step N - every_steps.
Under load that save was still being written when the fault went in, and the retry resumed from the
one before it. Here the checkpoint store holds every request until the injector looks for the ranks
at the gate, so the save stays unfinished for as long as it takes, whatever the machine's speed.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlparse

import pytest

import trainflow.drills.chaos as chaos
from tests.integration.conftest import BUCKET, unique_prefix
from tests.integration.test_checkpoint_engine import ThrottledProxy, key_prefix, new_job, worker_env
from trainflow.backends import Allocation, AttemptHandle
from trainflow.backends.local.launcher import LocalLauncher
from trainflow.checkpoint.manifest import MANIFEST_NAME, Manifest
from trainflow.drills.chaos import FaultKind, FaultPlan, Injection
from trainflow.drills.drill import last_finished_save
from trainflow.worker_config import fault_gate_path, gate_arrival_path, step_gate

pytestmark = pytest.mark.integration

EVERY, FAULT_STEP = 10, 20


class HeldStore(ThrottledProxy):
    """The S3 endpoint behind a relay that passes nothing on until `release()`: connections open,
    requests sent, no answer yet."""

    def __init__(self, target_port: int):
        self.released = threading.Event()
        super().__init__(target_port, rate=float("inf"))

    def release(self) -> None:
        self.released.set()

    def _pump(self, source, sink, throttled: bool) -> None:
        self.released.wait()
        super()._pump(source, sink, throttled)


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_gated_fault_waits_for_the_save_before_the_faults_step(tmp_path, s3, s3_endpoint, monkeypatch):
    store = HeldStore(urlparse(s3_endpoint).port)
    uri = unique_prefix()
    # every checkpoint goes to the store only, so "committed" means its manifest is in the bucket
    job = new_job(
        tmp_path,
        uri,
        worker_env(f"http://127.0.0.1:{store.port}"),
        local_tier=False,
        every_steps=EVERY,
        pause_at_step=FAULT_STEP,
    )
    manifest_key = f"{key_prefix(uri)}/{job.run_id}/step-{FAULT_STEP - EVERY:08d}/{MANIFEST_NAME}"
    gate = step_gate(fault_gate_path(tmp_path / job.run_id, 1), FAULT_STEP)
    seen: dict = {}

    real_wait_at_gate = chaos.wait_at_gate

    def release_then_wait_at_gate(*args, **kwargs):
        # the injector has seen every rank report the fault's step, with the step-10 save held
        seen["committed_when_every_rank_reported"] = committed(s3, manifest_key)
        seen["at_gate_when_every_rank_reported"] = [gate_arrival_path(gate, r).exists() for r in range(2)]
        store.release()
        return real_wait_at_gate(*args, **kwargs)

    monkeypatch.setattr(chaos, "wait_at_gate", release_then_wait_at_gate)

    def inject_crash(channel) -> None:
        handle = AttemptHandle(attempt=1, nodes=2, started_at=time.time(), logs={}, pause_at_steps=(FAULT_STEP,))
        allocation = Allocation(run_id=job.run_id, backend="local", nodes=2, scratch=tmp_path / job.run_id)
        plan = FaultPlan(kind=FaultKind.crash, at_step=FAULT_STEP, rank=1)
        try:
            seen["injection"] = chaos.inject(
                plan, LocalLauncher(), handle, channel, allocation, uri, world_size=2, timeout_s=180
            )
            seen["manifest"] = committed(s3, manifest_key)
        finally:
            store.release()  # whatever happened, let the workers' requests through so they can end

    try:
        attempt = job.run(steps=3 * EVERY, during=inject_crash)
    finally:
        store.release()
        store.stop()

    injection: Injection = seen["injection"]
    assert injection.injected, (injection, attempt.explain())
    assert attempt.returncodes[1] != 0  # node 1's rank was crashed
    # the fault went in after the save the verdict counts on had been committed
    assert last_finished_save(FAULT_STEP, EVERY, at_gate=True) == FAULT_STEP - EVERY
    manifest = seen["manifest"]
    assert manifest is not None, f"the fault went in before the step-{FAULT_STEP - EVERY} save was committed"
    assert manifest.committed_at < injection.injected_at
    assert injection.detail["at_gate"] is True and injection.detail["step"] == FAULT_STEP
    # and it was the race: every rank had reported the fault's step with that save still unfinished
    assert seen["committed_when_every_rank_reported"] is None
    assert seen["at_gate_when_every_rank_reported"] == [False, False]


def committed(s3, key: str) -> Manifest | None:
    try:
        return Manifest.from_json(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None
