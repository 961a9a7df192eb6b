"""S3 checkpoint storage through boto3; endpoint and credentials come from the AWS environment."""

from __future__ import annotations

from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from trainflow.checkpoint.storage import AlreadyExists, StorageError

TRANSFER = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=8)


def split_s3_uri(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if len(bucket) < 3:
        raise StorageError(f"{uri}: bucket name must have at least 3 characters")
    return bucket, prefix.strip("/")


class S3Storage:
    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = split_s3_uri(uri)
        self.client = boto3.client(
            "s3", config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=30)
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, what: str, exc: Exception) -> StorageError:
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "error")
            return StorageError(f"{self.uri}/{what}: {code}")
        return StorageError(f"{self.uri}/{what}: {type(exc).__name__}")

    def upload(self, path: Path, key: str) -> None:
        try:
            self.client.upload_file(str(path), self.bucket, self._key(key), Config=TRANSFER)
        except (BotoCoreError, ClientError, boto3.exceptions.S3UploadFailedError) as exc:
            raise self._fail(key, exc) from None

    def download(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.client.download_file(self.bucket, self._key(key), str(path), Config=TRANSFER)
        except (BotoCoreError, ClientError) as exc:
            raise self._fail(key, exc) from None

    def put_if_absent(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise AlreadyExists(f"{self.uri}/{key} already exists") from None
            raise self._fail(key, exc) from None
        except BotoCoreError as exc:
            raise self._fail(key, exc) from None

    def read(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except (BotoCoreError, ClientError) as exc:
            raise self._fail(key, exc) from None

    def size(self, key: str) -> int | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._fail(key, exc) from None
        except BotoCoreError as exc:
            raise self._fail(key, exc) from None

    def list(self, prefix: str = "") -> list[str]:
        # a prefix names a folder: listing run-1 must not return run-10
        full = self._key(prefix.rstrip("/") + "/") if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        except (BotoCoreError, ClientError) as exc:
            raise self._fail(prefix, exc) from None
        return sorted(keys)

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            try:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except (BotoCoreError, ClientError) as exc:
                raise self._fail("delete", exc) from None

    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "error")
            reason = "bucket does not exist" if code in ("404", "NoSuchBucket") else f"not accessible ({code})"
            raise StorageError(f"{self.uri}: {reason}") from None
        except BotoCoreError as exc:
            raise StorageError(f"{self.uri}: S3 endpoint unreachable ({type(exc).__name__})") from None
