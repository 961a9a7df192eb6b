"""The S3 tier on a real S3 HTTP endpoint (moto on loopback): batch transfers through the transfer
manager, multipart uploads that never finished, and the upload helper process."""

from __future__ import annotations

import hashlib
import os
import signal
import time
import uuid

import pytest
from boto3.s3.transfer import TransferConfig

from tests.integration.conftest import BUCKET, s3_environment
from trainflow.checkpoint import s3 as s3_module
from trainflow.checkpoint.catalog import abort_stale_uploads, checkpoint_prefix
from trainflow.checkpoint.s3 import S3Storage
from trainflow.checkpoint.storage import StorageError
from trainflow.checkpoint.transfer_agent import TransferAgent

pytestmark = pytest.mark.integration
MB = 1 << 20


@pytest.fixture
def aws(s3_endpoint, monkeypatch):
    for key, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def storage(aws) -> S3Storage:
    return S3Storage(f"s3://{BUCKET}/tier-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def small_parts(monkeypatch):
    """Parts and ranges of 5 MiB (S3's minimum part), so a few MiB exercise multipart both ways."""
    config = TransferConfig(multipart_threshold=5 * MB, multipart_chunksize=5 * MB, max_concurrency=4)
    monkeypatch.setattr(s3_module, "UPLOAD", config)
    monkeypatch.setattr(s3_module, "DOWNLOAD", config)


def files(folder, sizes: dict[str, int]) -> dict[str, bytes]:
    data = {name: os.urandom(size) for name, size in sizes.items()}
    for name, body in data.items():
        (folder / name).write_bytes(body)
    return data


def test_a_checkpoints_files_go_up_and_down_in_one_batch(storage, small_parts, tmp_path):
    data = files(tmp_path, {"__0_0.distcp": 12 * MB + 7, "__1_0.distcp": 11 * MB, ".metadata": 3000, "state.json": 10})
    prefix = checkpoint_prefix("run-a", 40)
    storage.upload_many([(tmp_path / name, f"{prefix}/{name}") for name in data])
    assert storage.list("run-a") == sorted(f"{prefix}/{name}" for name in data)
    back = tmp_path / "back"
    storage.download_many([(f"{prefix}/{name}", back / name) for name in data])
    for name, body in data.items():
        assert hashlib.sha256((back / name).read_bytes()).digest() == hashlib.sha256(body).digest()
    assert storage.list_incomplete("run-a") == []


def test_a_failed_batch_names_what_failed(storage, tmp_path):
    data = files(tmp_path, {"a": 100})
    with pytest.raises(StorageError, match="not found"):
        storage.upload_many([(tmp_path / "a", "run/a"), (tmp_path / "missing", "run/missing")])
    with pytest.raises(StorageError, match="run/nope"):
        storage.download_many([("run/nope", tmp_path / "nope")])
    assert data and not (tmp_path / "nope").exists()


def test_unfinished_multipart_uploads_are_found_and_aborted(storage, s3):
    root = storage.prefix
    started = {}
    for step in (10, 20, 30):
        key = f"{root}/run-a/step-{step:08d}/__0_0.distcp"
        started[step] = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    s3.create_multipart_upload(Bucket=BUCKET, Key=f"{root}/run-b/step-00000010/__0_0.distcp")

    found = storage.list_incomplete("run-a")
    assert {(i.key, i.upload_id) for i in found} == {
        (f"run-a/step-{step:08d}/__0_0.distcp", upload) for step, upload in started.items()
    }
    aborted = abort_stale_uploads(storage, "run-a", up_to_step=20)  # what the snapshot task does after commit 20
    assert sorted(aborted) == ["run-a/step-00000010/__0_0.distcp", "run-a/step-00000020/__0_0.distcp"]
    assert [i.key for i in storage.list_incomplete("run-a")] == ["run-a/step-00000030/__0_0.distcp"]
    assert len(storage.list_incomplete("run-b")) == 1
    storage.abort_incomplete(storage.list_incomplete())
    storage.abort_incomplete(found)  # already gone: quiet
    assert storage.list_incomplete() == []


def test_the_upload_helper_process_uploads_and_reports_failures(storage, tmp_path):
    data = files(tmp_path, {"shard": 2 * MB, "rank-0.json": 50})
    agent = TransferAgent(storage.uri)
    try:
        agent.upload_many([(tmp_path / name, f"run/step-00000001/{name}") for name in data])
        assert storage.read("run/step-00000001/rank-0.json") == data["rank-0.json"]
        assert storage.size("run/step-00000001/shard") == 2 * MB
        with pytest.raises(StorageError, match="not found"):
            agent.upload_many([(tmp_path / "missing", "run/step-00000001/missing")])
        agent.upload_many([(tmp_path / "shard", "run/step-00000002/shard")])  # still serving after a failure
        proc = agent._proc
    finally:
        agent.close()
    assert proc.poll() is not None  # gone with its pipe


def test_the_upload_helper_process_exits_when_closed_while_a_fork_holds_its_input(storage, tmp_path):
    """A DataLoader worker forked after the helper started holds the rank's end of the helper's
    input: closing the pipe alone would not end the helper, being told to does."""
    (tmp_path / "f").write_bytes(b"x")
    agent = TransferAgent(storage.uri)
    worker = None
    try:
        agent.upload_many([(tmp_path / "f", "run/f")])
        proc = agent._proc
        worker = os.fork()
        if worker == 0:
            time.sleep(60)
            os._exit(0)
        agent.close()
    finally:
        agent.close()
        if worker:
            os.kill(worker, signal.SIGKILL)
            os.waitpid(worker, 0)
    assert proc.returncode == 0  # it exited itself, not killed after close()'s 10 s


def test_the_upload_helper_process_reports_an_unreachable_endpoint(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    (tmp_path / "f").write_bytes(b"x")
    agent = TransferAgent("s3://some-bucket/x")
    try:
        with pytest.raises(StorageError, match="EndpointConnectionError|ConnectionError"):
            agent.upload_many([(tmp_path / "f", "run/f")])
    finally:
        agent.close()
