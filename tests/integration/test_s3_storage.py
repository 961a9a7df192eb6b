"""S3Storage against a real S3 HTTP endpoint (moto on loopback), through boto3."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.integration.conftest import BUCKET, s3_environment
from trainflow.checkpoint.s3 import S3Storage
from trainflow.checkpoint.storage import AlreadyExists, StorageError

pytestmark = pytest.mark.integration


@pytest.fixture
def storage(s3_endpoint, monkeypatch):
    for key, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    return S3Storage(f"s3://{BUCKET}/storage-{uuid.uuid4().hex[:8]}")


def test_commit_is_create_only(storage):
    storage.put_if_absent("run/step-1/manifest.json", b"first")
    with pytest.raises(AlreadyExists):
        storage.put_if_absent("run/step-1/manifest.json", b"second")
    assert storage.read("run/step-1/manifest.json") == b"first"


def test_round_trip_and_folder_listing(storage, tmp_path):
    source = tmp_path / "shard"
    source.write_bytes(os.urandom(1 << 16))
    for run in ("run-1", "run-10"):
        storage.upload(source, f"{run}/step-00000001/shard")
    assert storage.list("run-1") == ["run-1/step-00000001/shard"]
    assert storage.size("run-1/step-00000001/shard") == 1 << 16
    assert storage.size("run-1/step-00000002/shard") is None
    storage.download("run-10/step-00000001/shard", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == source.read_bytes()
    storage.delete(storage.list("run-1"))
    assert storage.list() == ["run-10/step-00000001/shard"]


def test_missing_bucket_is_a_clear_error(s3_endpoint, monkeypatch):
    for key, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(StorageError, match="bucket does not exist"):
        S3Storage("s3://no-such-bucket-anywhere/x").check()


def test_unreachable_endpoint_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(StorageError, match="unreachable"):
        S3Storage("s3://some-bucket/x").check()
