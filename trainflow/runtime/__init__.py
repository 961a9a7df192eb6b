"""What a training script sees of trainflow: init, restore, the step loop, log, checkpoint.

    import trainflow.runtime as tf

    run = tf.init()                                    # process group, seeds, device
    model = DDP(Net().to(run.device))                  # or fully_shard(Net(), mesh=run.mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = run.restore(model=model, optimizer=optimizer, data=batches)
    for step in run.steps(start, samples_per_step=global_batch):
        loss = train_step(batches.next())
        run.log(loss=loss.item())                      # checkpoints happen every N steps by themselves
    run.finish()

`run.parallel` and `run.mesh` are the spec's layout (runtime/layout.py); `run.batches(loader, start)`
is the same loop over a ResumableLoader, epoch after epoch (runtime/data.py).

Launched by `trainflow run SPEC`, never by hand: the orchestrator passes everything else.
Workers report heartbeats, progress, metrics and events to the orchestrator only; they never
write to MLflow or Prefect.
"""

from __future__ import annotations

import faulthandler
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from trainflow.checkpoint.storage import open_storage
from trainflow.contracts import status_protocol as wire
from trainflow.runtime import exit_codes, in_place
from trainflow.runtime.checkpointing import Checkpointer, Stateful
from trainflow.runtime.comm_timer import CommTimer
from trainflow.runtime.control import ControlPlane
from trainflow.runtime.data import ResumableLoader, epochs_of
from trainflow.runtime.ddp_buckets import BucketOrder
from trainflow.runtime.error_report import report_uncaught_errors
from trainflow.runtime.exit_deadline import end_within
from trainflow.runtime.fault_gate import raise_on_drill_signal, wait_for_fault
from trainflow.runtime.group_sockets import note_group_sockets
from trainflow.runtime.layout import ParallelLayout
from trainflow.runtime.leave_groups import leave_process_groups
from trainflow.runtime.process_clock import process_started_at
from trainflow.runtime.reporter import StatusReporter, status_address
from trainflow.runtime.resources import ResourceSampler
from trainflow.runtime.sharding import layout_warnings, replicated_dims
from trainflow.runtime.state import full_params_sha256, seed_everything
from trainflow.runtime.step_reports import StepReports
from trainflow.worker_config import REPLACES_ENV, WorkerConfig, step_gate

__all__ = ["ResumableLoader", "Run", "init"]

BUCKET_ORDER = "trainflow.ddp_buckets"  # the extra's name: no keyword argument of restore() can take it


class Run:
    """One worker's view of the job; created by `init()`."""

    def __init__(self, config: WorkerConfig):
        imported_at = time.time()  # the script's imports are done: the recovery phases' points
        self.config = config
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.seed = config.seed
        self.total_steps = config.total_steps
        self.step = 0
        self.device = self._pick_device()
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.parallel = ParallelLayout.for_world(
            config.parallel_strategy,
            config.tensor_degree,
            config.pipeline_degree,
            self.world_size,
            max(1, self.world_size // local_world),
            self.rank,
        )
        self._mesh = None
        in_place_on = in_place.enabled(config)
        resuming = in_place.pending() if in_place_on else None  # the script runs again after a failure
        # a process started in place of this rank's, which died (backends/rank_replacement.py)
        replacing = in_place_on and in_place.carried() is None and os.environ.get(REPLACES_ENV)
        died = json.loads(replacing) if replacing else None
        if resuming is not None:
            self.reporter = in_place.carried().reporter
        else:
            identity = {"rank": self.rank, "node": config.node, "attempt": config.attempt, "pid": os.getpid()}
            self.reporter = StatusReporter(
                status_address(config.status_address),
                config.status_token,
                identity={**identity, "replaces": died["pids"]} if died else identity,
                heartbeat_interval_s=config.heartbeat_interval_s,
                orchestrator_timeout_s=config.orchestrator_timeout_s,
            )
        self._reports = StepReports(self.reporter, self.is_main)
        report_uncaught_errors(self.reporter, self._flush_progress, lambda: self.step)
        if in_place_on:
            note_group_sockets()  # so that a failure can break the groups off (runtime/group_sockets.py)
        if died is not None:  # into the round its peers are in, to go on from the dead one's copies
            resuming = in_place.join_as_replacement(self.rank, self.world_size, config, self.reporter, died)
        dist.init_process_group(
            backend=config.comm_backend,
            timeout=timedelta(seconds=config.collective_timeout_s),
            device_id=self.device if self.device.type == "cuda" else None,
            **(
                {"store": in_place.new_group_store(resuming.round), "rank": self.rank, "world_size": self.world_size}
                if resuming is not None
                else {}
            ),
        )
        rendezvous_at = time.time()
        seed_everything(config.seed + self.rank)
        self._control = ControlPlane(
            self.rank,
            self.world_size,
            config.divergence_check_every_steps,
            memory_every_steps=config.memory_every_steps if in_place_on else 0,
        )
        self._comm = CommTimer()
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # stack dumps on demand, into the node log
        if config.fault_gate:  # a drill's attempt: its exception fault
            raise_on_drill_signal(self.rank, lambda: self.step)
        self._checkpointer = Checkpointer(
            config,
            open_storage(config.checkpoint_uri),
            self.rank,
            self.world_size,
            local_rank=self.local_rank,
            send=self.reporter.send,
            # a script run again in place saves anew: never into an earlier run's local folders
            series=f"r{resuming.round}-" if resuming is not None else "",
        )
        self._state: Stateful | None = None
        self._bucket_order: BucketOrder | None = None
        self._metrics: dict[str, float] = {}
        self._last_loss: float | None = None
        self._saved_step: int | None = None
        self._durable_step: int | None = None  # the newest step this worker knows is in the checkpoint store
        self._data_wait = 0.0
        self._copies = None
        if in_place_on:
            in_place.attach(self, in_place.job_store(distributed_c10d._get_default_store()))
            self._copies = in_place.carried().copies
        if self.local_rank == 0:  # one sampler per node
            self._resources = ResourceSampler(lambda figures: self.reporter.send(wire.Resources(figures=figures)))
        if resuming is None:  # a script run again in place reports its round instead (runtime/in_place.py)
            self.reporter.send(
                wire.Started(
                    world_size=self.world_size,
                    process_started_at=process_started_at(),
                    imported_at=imported_at,
                    rendezvous_at=rendezvous_at,
                )
            )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def mesh(self):
        """The DeviceMesh of the spec's layout, dimensions named as `run.parallel.dim_names` (see
        runtime/layout.py). Built on first use; every rank must first use it at the same point."""
        if self._mesh is None:
            self._mesh = self.parallel.build_mesh(self.device.type)
        return self._mesh

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, **extras: Any) -> int:
        """Register the training state; load the checkpoint the orchestrator chose. Returns the step to
        continue after (0 for a fresh start). `extras` are objects with state_dict/load_state_dict
        returning JSON values (a data loader's position, a scheduler)."""
        # a DDP's bucket layout is part of the state: a resumed run must add its gradients up alike
        self._bucket_order = BucketOrder(model)
        self._state = Stateful(model=model, optimizer=optimizer, extras={**extras, BUCKET_ORDER: self._bucket_order})
        resuming = in_place.pending() if self._copies is not None else None
        self._check_layout(model, announce=resuming is None)
        if resuming is not None:  # the same attempt goes on from this rank's memory copy
            self.step = in_place.restore(self)
            self._bucket_order.apply(self._control.group)
            if 0 < self.step < self.total_steps and self.step % self.config.every_steps == 0:
                # that step's save may have been in flight when the groups were broken off: save it
                # again (a commit that landed before is kept as it is, see runtime/publish.py)
                self.checkpoint()
                self._saved_step = self.step
            return self.step
        # this run's node-local copies first, then the orchestrator's choice and older ones, each
        # verified; a candidate that fails is skipped with its reason (see runtime/restore.py)
        restored = self._checkpointer.restore(self.config.restore_prefix, self._state)
        if restored is None:
            return 0
        self._bucket_order.apply(self._control.group)
        self.step = restored.step
        if restored.tier == "durable":
            self._durable_step = restored.step
        self.reporter.send(
            wire.Restored(
                step=restored.step,
                prefix=restored.prefix,
                tier=restored.tier,
                bytes=restored.bytes,
                seconds=restored.seconds,
                fallbacks=list(restored.fallbacks),
            )
        )
        if self.is_main:
            self._metrics.update(
                checkpoint_restore_s=restored.seconds,
                checkpoint_restore_transfer_s=restored.transfer_s,
                checkpoint_restore_verify_s=restored.verify_s,
                checkpoint_restore_load_s=restored.load_s,
                checkpoint_restore_MBps=restored.bytes / 1e6 / max(restored.seconds, 1e-9),
                checkpoint_restore_fallbacks=len(restored.fallbacks),
            )
        return self.step

    def _check_layout(self, model: torch.nn.Module, announce: bool = True) -> None:
        """Compare replicas only where the model has them; tell the orchestrator the attempt's
        degrees and where the model contradicts the declared layout."""
        replicated = replicated_dims(model, self.parallel)
        if replicated is not None:
            self._control.replica_groups = self.parallel.replica_groups(replicated)
        if self.is_main and announce:
            warnings = layout_warnings(model, self.parallel)
            for warning in warnings:
                print(f"trainflow: warning: {warning}", file=sys.stderr, flush=True)
            degrees = self.parallel.degrees()
            self.reporter.send(
                wire.Layout(
                    strategy=self.parallel.strategy,
                    world_size=degrees.pop("world_size"),
                    dp_degree=degrees.pop("dp_degree"),
                    tp_degree=degrees.pop("tp_degree"),
                    pp_degree=degrees.pop("pp_degree"),
                    mesh=degrees,
                    replicated=list(replicated) if replicated is not None else None,
                    warnings=warnings,
                )
            )

    def steps(self, start: int = 0, samples_per_step: int | None = None) -> Iterator[int]:
        """Yield the steps after `start` up to the job's total; reports progress, checkpoints, and
        at control points stops cleanly on preemption or replica divergence."""
        if self._state is not None:
            self._comm.attach(self._state.model, self._state.optimizer)
        for step in range(start + 1, self.total_steps + 1):
            began = time.perf_counter()
            self.step = step
            yield step
            ended = time.perf_counter()
            elapsed = ended - began
            self._report_step(step, elapsed, self._comm.take(began, ended), samples_per_step)
            if self._copies is not None:
                in_place.first_step_done(self.reporter)
            if self._bucket_order is not None and self._bucket_order.recording:
                self._bucket_order.stop_recording()
            checkpoint_due = step % self.config.every_steps == 0 or step == self.total_steps
            if checkpoint_due or self._control.due(step):
                # before saving: a checkpoint must never capture diverged replicas
                self._at_control_point(step, elapsed, verify=checkpoint_due)
            if checkpoint_due and self._saved_step != step:
                self.checkpoint()
                self._saved_step = step
            # a copy at every checkpoint too: a recovery in place never goes back further than a restart would
            copy_due = self._copies is not None and (checkpoint_due or self._control.memory_copy_due(step))
            if copy_due and self._state is not None:
                took = self._copies.take(step, self._state)
                self._control.memory_copy_took(took)
                if self.is_main:  # reported with the next step: what a copy costs, how often one is made
                    self._metrics.update(memory_copy_s=took, memory_copy_every_steps=self._control.memory_every)
            if step in self.config.pause_at_steps:
                self._flush_progress()
                wait_for_fault(
                    step_gate(Path(self.config.fault_gate), step),
                    self.rank,
                    step,
                    signalled=lambda: self._control.preempt_requested_at is not None,
                )
        if self._state is not None and self.step == self.total_steps and self._durable_step != self.step:
            # restored from a node-local copy of the last step, nothing left to train: that copy is
            # the only one, and a run succeeds only once its final state is in the checkpoint store
            self.checkpoint()

    def batches(
        self, loader: Iterable[Any], start: int = 0, samples_per_step: int | None = None
    ) -> Iterator[tuple[int, Any]]:
        """The step loop over a data loader, epoch after epoch: yields (step, batch) for the steps
        after `start`. With a ResumableLoader registered in restore(data=loader) a restored run
        continues mid-epoch at the very batch it would have had (see runtime/data.py)."""
        source = epochs_of(loader)
        try:
            for step in self.steps(start, samples_per_step):
                with self.waiting_for_data():
                    batch = next(source)
                yield step, batch
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # ends the loader's worker processes now, not whenever it is collected

    def _at_control_point(self, step: int, elapsed: float, verify: bool) -> None:
        model = self._state.model if self._state is not None else None
        stop, hashes = self._control.agree(step, elapsed, model, verify)
        if hashes is not None and self._control.diverged(hashes):
            if self.is_main:
                self.reporter.send(
                    wire.Diverged(
                        step=step, hashes=[f"{h:015x}" for h in hashes], groups=self._control.diverged(hashes)
                    )
                )
            self._leave(exit_codes.DIVERGED, f"replicas diverged at step {step}")
        if stop:
            # the emergency checkpoint, every rank at this same step; returns once it is durable
            # (for a step already saved on schedule it only waits for that save's commit)
            self.checkpoint()
            self._saved_step = step
            requested = self._control.preempt_requested_at
            self.reporter.send(wire.Preempted(step=step, signalled=requested is not None, requested_at=requested))
            self._leave(exit_codes.PREEMPTED, f"preempted: checkpoint at step {step} committed")

    def abandon(self, break_off_groups: Callable[[], int], save_within_s: float) -> tuple[int, bool]:
        """This run of the script ends in a failure and its process stays (runtime/in_place.py).
        The checkpoint save in flight, if any, ends first: it runs in every rank's background
        thread, which a failure in the training loop does not stop, and breaking the groups off
        under it could leave its collective waiting. Then the groups are broken off. Returns the
        connections shut, and whether that save ended within `save_within_s`."""
        self._flush_progress()
        if self.local_rank == 0:
            self._resources.stop()
        ended = self._checkpointer.abandon(save_within_s)
        shut = break_off_groups()
        self._state = None
        return shut, ended

    def _leave(self, code: int, message: str) -> None:
        self._flush_progress()
        print(f"trainflow: {message}; exiting with {code}", file=sys.stderr, flush=True)
        self.reporter.close()
        end_within()  # nothing watches this rank any more
        raise SystemExit(code)

    @contextmanager
    def waiting_for_data(self) -> Iterator[None]:
        """Wrap the fetch of the next batch: the time spent is reported as data_wait_s."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self._data_wait += time.perf_counter() - began

    def log(self, **metrics: float) -> None:
        """Metrics of the current step. The orchestrator records `loss` as the mean over the ranks
        (every rank sends its own); any other metric as rank 0 logged it."""
        for name, value in metrics.items():
            value = float(value)
            if name == "loss" and not math.isfinite(value):
                raise FloatingPointError(f"loss is {value} at step {self.step}")
            self._metrics[name] = value
        if "loss" in metrics:
            self._last_loss = float(metrics["loss"])

    def checkpoint(self) -> None:
        """Save, publish and commit the registered state at the current step (collective)."""
        if self._state is None:
            raise RuntimeError("call run.restore(model=..., optimizer=...) before checkpointing")
        self._flush_progress()
        # On the every_steps schedule training only waits for the state to be staged; any other
        # call (the last step, a preemption, an explicit call, a second call for the same step)
        # returns once the checkpoint is committed to the checkpoint URI.
        preempting = getattr(getattr(self, "_control", None), "preempt_requested_at", None) is not None
        scheduled = self.step % self.config.every_steps == 0 and self.step < self.total_steps
        saved = self._checkpointer.save(self.step, self._state, commit=preempting or not scheduled)
        if saved.committed:
            self._durable_step = self.step
        if self.is_main:
            self._metrics.update(self._checkpointer.take_metrics())

    def finish(self) -> None:
        """Report finishing (rank 0: with the final parameters' hash) and leave the process group."""
        self._flush_progress()
        self._checkpointer.close()  # the save in flight finishes first
        if self._state is not None:
            # every rank reports for itself: the orchestrator counts the attempt finished only
            # once the whole world has, each from its own connection
            digest = full_params_sha256(self._state.model)  # collective: sharded parameters are gathered
            # final_loss: the mean of the ranks' last losses; rank 0's hash is the run's
            self.reporter.send(
                wire.Finished(step=self.step, loss=self._last_loss, params_sha256=digest if self.is_main else None)
            )
        leave_process_groups()  # barriers first: every rank's report is in before any connection closes
        self.reporter.close()

    def _report_step(self, step: int, elapsed: float, comm_wait: float, samples_per_step: int | None) -> None:
        self._reports.add(step, elapsed, comm_wait, self._data_wait, self._metrics, samples_per_step)
        self._metrics = {}
        self._data_wait = 0.0

    def _flush_progress(self) -> None:
        self._reports.flush()

    def _pick_device(self) -> torch.device:
        if self.config.comm_backend == "nccl" and torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")


def init() -> Run:
    """Join the job: process group from torchrun's environment, seeds, device, status channel."""
    return Run(WorkerConfig.from_env())
