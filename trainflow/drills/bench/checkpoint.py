"""`trainflow bench checkpoint`: what checkpoints cost training, and how fast they move bytes.

Everything runs in one go against the same S3-compatible endpoint and the same local disk: the
real checkpoint engine (trainflow.runtime.checkpointing, a gloo group of one process) saving a
synthetic MLP whose checkpoint — parameters plus SGD momentum — is `--size-mb`, next to plain
boto3 calls on the same bytes: `--uri`, else the bucket `trainflow-bench` on the endpoint the AWS
environment names (AWS_ENDPOINT_URL_S3), else — no endpoint configured — a moto_server of its own on
a free loopback port (at a low CPU priority: it stands in for a store that is not on the training
node), stopped at the end. Training uses one thread, as a worker with one core would; the
background save runs below training's priority, as it does in every worker.

Figures (medians over several saves and transfers; throughput rounds alternate with and without):
  sync_stall_s             training paused for a save done while it waits: stage, write, hash,
                           upload, commit (what a synchronous checkpoint costs)
  async_stall_s            training paused for an asynchronous save: staging to host memory
  local_write_MBps         DCP write of the checkpoint into the node-local tier
  s3_upload_MBps           a snapshot's upload (every file in parallel, transfer manager, helper
                           process) at training's priority, as the raw call below runs;
                           s3_upload_background_MBps is the same below training's priority
  raw_boto3_upload_MBps    a plain `upload_file` of the same number of bytes, boto3's defaults
  s3_restore_MBps          download of the committed checkpoint's files by a restore
  raw_boto3_download_MBps  a plain `download_file` of the same bytes, boto3's defaults
  verify_s                 sha256 of every restored file against the manifest
  step_overhead_pct        what checkpoints at the spec's defaults cost training over a long run: every
                           `checkpoint.every_steps` steps a save to the local tier, and at most every
                           `checkpoint.snapshot_every_s` one that is also uploaded — the two measured
                           below, weighted by how many intervals of each the defaults make
  step_overhead_local_pct  training time of `every_steps` steps with a checkpoint that stays on the
                           node-local tier — its stall, the slower steps while it runs in the
                           background, and any of it left at the interval's end — over the same steps
                           without; the median over alternating intervals
  step_overhead_snapshot_pct  the same for a checkpoint that is also uploaded to S3
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trainflow.checkpoint.location import S3Location
from trainflow.drills.bench.checkpoint_report import MB, render
from trainflow.drills.bench.s3_endpoint import SERVER_NICENESS, BenchError, s3_store

__all__ = ["SERVER_NICENESS", "BenchError", "Options", "render", "run_benchmark"]

WIDTH = 1024  # the MLP's layers are WIDTH x WIDTH, float32: 4 MiB of parameters and 4 of momentum each

TARGETS = {
    # figure: (what is compared, how it reads, passes)
    "async_stall": ("async_stall_s / sync_stall_s", "<= 0.1", lambda r: r <= 0.1),
    "upload": ("s3_upload_MBps / raw_boto3_upload_MBps", ">= 0.8", lambda r: r >= 0.8),
    "restore": ("s3_restore_MBps / raw_boto3_download_MBps", ">= 0.8", lambda r: r >= 0.8),
    "step_overhead": ("step_overhead_pct", "<= 5", lambda r: r <= 5.0),
}


@dataclass(frozen=True)
class Options:
    size_mb: int = 64
    uri: str | None = None  # s3://bucket/prefix; None: an own moto_server
    batch: int = 128  # rows per training step of the synthetic model
    pairs: int = 15  # checkpoint intervals trained without, then with a checkpoint
    repeats: int = 5  # saves, uploads and restores measured (medians reported)


def run_benchmark(options: Options, log=lambda text: None) -> dict:
    """Run every measurement; returns the figures and which targets they meet."""
    if options.size_mb < 8:
        raise BenchError("--size-mb must be at least 8 (one 1024x1024 layer and its momentum)")
    with ExitStack() as stack:
        uri, endpoint = stack.enter_context(s3_store(options.uri, log))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trainflow-bench-")))
        stack.enter_context(_process_group())
        stack.enter_context(_threads(1))
        return _measure(options, uri, endpoint, work, log)


def _measure(options: Options, uri: str, endpoint: str, work: Path, log) -> dict:
    import boto3
    import torch

    from trainflow.checkpoint import s3 as s3_module
    from trainflow.checkpoint.catalog import checkpoint_prefix
    from trainflow.checkpoint.storage import open_storage
    from trainflow.runspec import Checkpoint
    from trainflow.runtime.checkpointing import Checkpointer, Stateful
    from trainflow.worker_config import WorkerConfig

    defaults = Checkpoint()
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    config = WorkerConfig(
        run_id=run_id,
        attempt=1,
        node=0,
        status_address="127.0.0.1:9",
        status_token="bench",
        checkpoint_uri=uri,
        every_steps=defaults.every_steps,
        total_steps=10**9,
        seed=0,
        spec_hash="0" * 64,
        code_version="bench",
        comm_backend="gloo",
        collective_timeout_s=600.0,
        heartbeat_interval_s=1.0,
        orchestrator_timeout_s=60.0,
        node_scratch=str(work / "node-0"),
        snapshot_every_s=0.0,
        keep_every_steps=0,
        local_tier=defaults.local_tier,  # every save uploads
    )
    events: list[dict] = []
    storage = open_storage(uri)
    collect = lambda message: events.append({"kind": message.kind, **asdict(message)})  # noqa: E731
    saver = Checkpointer(config, storage, 0, 1, send=collect)
    # a synchronous save runs on the training thread, at training's priority: so does this yardstick
    syncer = Checkpointer(replace(config, node_scratch=str(work / "node-s")), storage, 0, 1, send=collect, niceness=0)

    torch.manual_seed(0)
    layers = max(1, round(options.size_mb * MB / (8 * WIDTH * WIDTH)))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    batch = torch.randn(options.batch, WIDTH)
    state = Stateful(model=model, optimizer=optimizer, extras={})

    def train(steps: int) -> None:
        for _ in range(steps):
            loss = model(batch).pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    step = 0

    def advance() -> int:
        nonlocal step
        train(1)
        step += 1
        return step

    log(f"model: {layers} x {WIDTH}x{WIDTH} linear layers; warming up")
    for checkpointer in (saver, syncer):  # first saves: buffers allocated, connections opened
        checkpointer.save(advance(), state, commit=True)

    log("saves: synchronous and asynchronous, with plain boto3 on the same bytes in between")
    client = boto3.client("s3")  # boto3's defaults: the yardstick
    location = S3Location.parse(uri)
    bucket, raw_key = location.bucket, location.key(run_id, "raw-boto3")
    blob = work / "raw.bin"
    sync_stalls, async_stalls, writes, uploads, background_uploads, raw_ups = [], [], [], [], [], []
    for _ in range(options.repeats):
        began = time.perf_counter()
        syncer.save(advance(), state, commit=True)
        sync_stalls.append(time.perf_counter() - began)
        committed = [e for e in events if e.get("status") == "committed"][-1]
        size = committed["bytes"]
        uploads.append(size / MB / committed["upload_s"])  # the engine's upload, at training's priority

        outcome = saver.save(advance(), state)
        async_stalls.append(outcome.stall_s)
        saver.wait()
        committed = [e for e in events if e.get("status") == "committed"][-1]
        writes.append(size / MB / committed["save_s"])
        background_uploads.append(size / MB / committed["upload_s"])

        if not blob.exists():
            _concatenate(saver.tier.folder(saver.tier.committed(run_id)[-1].prefix), blob)
        began = time.perf_counter()
        client.upload_file(str(blob), bucket, raw_key)
        raw_ups.append(blob.stat().st_size / MB / (time.perf_counter() - began))
    syncer.close()

    log("restores from S3, and plain boto3 downloads of the same bytes")
    restorer = Checkpointer(replace(config, local_tier=False, node_scratch=str(work / "node-r")), storage, 0, 1)
    prefix = checkpoint_prefix(run_id, step)
    restores, verifies, totals, raw_downs = [], [], [], []
    for _ in range(options.repeats):
        restored = restorer.restore(prefix, state)
        restores.append(restored.bytes / MB / restored.transfer_s)
        verifies.append(restored.verify_s)
        totals.append(restored.seconds)
        began = time.perf_counter()
        client.download_file(bucket, raw_key, str(work / "raw-back.bin"))
        raw_downs.append(blob.stat().st_size / MB / (time.perf_counter() - began))
        (work / "raw-back.bin").unlink()
    restorer.close()

    # the same saves kept on the node-local tier: what checkpoints between snapshots cost
    local_only = Checkpointer(
        replace(config, node_scratch=str(work / "node-l"), snapshot_every_s=86400.0), storage, 0, 1, send=collect
    )
    local_only.save(advance(), state, commit=True)  # its first save is a snapshot, as in every attempt

    every = config.every_steps
    log(f"training throughput: {options.pairs} x {every} steps without, then with a checkpoint (and its wait)")
    plain_s: list[float] = []
    overheads: dict[str, list[float]] = {"snapshot": [], "local": []}
    for _ in range(options.pairs):  # interval by interval, alternating, so other load hits both alike
        for kind, checkpointer in (("snapshot", saver), ("local", local_only)):
            began = time.perf_counter()
            train(every)
            plain = time.perf_counter() - began
            step += every
            began = time.perf_counter()
            checkpointer.save(advance(), state)
            train(every - 1)
            step += every - 1
            checkpointer.wait()  # what is left of the save after its interval, the next save would wait for
            overheads[kind].append((time.perf_counter() - began) / plain - 1.0)
            plain_s.append(plain)
    local_only.close()
    failed = [e for e in events if e["kind"] == "checkpoint" and e.get("status") != "committed"]
    saver.close()

    figures = {
        "size_mb": options.size_mb,
        "checkpoint_bytes": size,
        "checkpoint_files": committed["files"],
        "endpoint": endpoint,
        "s3_upload_part_mb": s3_module.UPLOAD_PART_MB,
        "s3_download_part_mb": s3_module.DOWNLOAD_PART_MB,
        "s3_concurrency": s3_module.CONCURRENCY,
        "sync_stall_s": _median(sync_stalls),
        "async_stall_s": _median(async_stalls),
        "local_write_MBps": _median(writes),
        "s3_upload_MBps": _median(uploads),
        "s3_upload_background_MBps": _median(background_uploads),
        "raw_boto3_upload_MBps": _median(raw_ups),
        "s3_restore_MBps": _median(restores),
        "raw_boto3_download_MBps": _median(raw_downs),
        "verify_s": _median(verifies),
        "restore_s": _median(totals),
        "step_time_s": round(statistics.median(plain_s) / every, 4),
        "checkpoint_every_steps": every,
        "snapshot_every_s": defaults.snapshot_every_s,
        "step_overhead_pct": round(
            100.0 * _default_overhead(overheads, statistics.median(plain_s), defaults.snapshot_every_s), 2
        ),
        "step_overhead_local_pct": round(100.0 * statistics.median(overheads["local"]), 2),
        "step_overhead_snapshot_pct": round(100.0 * statistics.median(overheads["snapshot"]), 2),
        "failed_saves": len(failed),
    }
    ratios = {
        "async_stall": figures["async_stall_s"] / figures["sync_stall_s"],
        "upload": figures["s3_upload_MBps"] / figures["raw_boto3_upload_MBps"],
        "restore": figures["s3_restore_MBps"] / figures["raw_boto3_download_MBps"],
        "step_overhead": figures["step_overhead_pct"],
    }
    figures["targets"] = {
        name: {"measure": what, "value": round(ratios[name], 3), "target": goal, "met": bool(passes(ratios[name]))}
        for name, (what, goal, passes) in TARGETS.items()
    }
    _remove_prefix(storage, run_id)
    return figures


def _default_overhead(overheads: dict[str, list[float]], interval_s: float, snapshot_every_s: float) -> float:
    """Over a long run at the defaults, one interval in every snapshot_every_s / interval_s ends
    in a snapshot, the others in a checkpoint that stays on the local tier."""
    local, snapshot = statistics.median(overheads["local"]), statistics.median(overheads["snapshot"])
    share = 1.0 if snapshot_every_s <= 0 else min(1.0, interval_s / snapshot_every_s)
    return local + (snapshot - local) * share


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def _concatenate(folder: Path, target: Path) -> None:
    """The checkpoint's bytes as one file: what a plain upload_file gets to move."""
    with open(target, "wb") as out:
        for path in sorted(folder.iterdir()):
            if path.name != "manifest.json":
                with open(path, "rb") as source:
                    shutil.copyfileobj(source, out, 4 * MB)


def _remove_prefix(storage, run_id: str) -> None:
    keys = storage.list(run_id)
    storage.delete(keys)


@contextmanager
def _threads(count: int):
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextmanager
def _process_group():
    import torch.distributed as dist

    from trainflow.backends.ports import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
