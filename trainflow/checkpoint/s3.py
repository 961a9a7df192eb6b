"""S3 checkpoint storage through boto3; endpoint and credentials come from the AWS environment.

Files move through boto3's transfer manager, one manager per batch: every file of a checkpoint is
in flight at once, and several parts of each. The defaults were measured with `trainflow bench
checkpoint` against boto3's own on the same server: 8 MiB parts up (larger parts upload slower,
fewer requests in flight), 32 MiB ranges down (2-3x boto3's default). `TRAINFLOW_S3_UPLOAD_PART_MB`,
`TRAINFLOW_S3_DOWNLOAD_PART_MB` and `TRAINFLOW_S3_CONCURRENCY` tune them for another store.

The commit is a conditional `put_object(IfNoneMatch="*")` of the small manifest. A failed
multipart upload is aborted by the transfer manager when the endpoint still answers; what an
unreachable endpoint or a killed process leaves behind is found by `list_incomplete` and aborted.
"""

from __future__ import annotations

import os
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from trainflow.checkpoint.location import S3Location
from trainflow.checkpoint.store import AlreadyExists, Incomplete, StorageError

MB = 1 << 20


def _setting(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, default))
    except ValueError:
        raise StorageError(f"{name}={os.environ[name]!r} is not a whole number") from None
    if value <= 0:
        raise StorageError(f"{name} must be positive")
    return value


UPLOAD_PART_MB = _setting("TRAINFLOW_S3_UPLOAD_PART_MB", 8)  # part size of multipart uploads
DOWNLOAD_PART_MB = _setting("TRAINFLOW_S3_DOWNLOAD_PART_MB", 32)  # range size of parallel downloads
CONCURRENCY = _setting("TRAINFLOW_S3_CONCURRENCY", 10)  # requests in flight at once, across a batch's files

UPLOAD = TransferConfig(
    multipart_threshold=UPLOAD_PART_MB * MB, multipart_chunksize=UPLOAD_PART_MB * MB, max_concurrency=CONCURRENCY
)
# ranged GETs pay off for files larger than two ranges; smaller ones stream in one request
DOWNLOAD = TransferConfig(
    multipart_threshold=2 * DOWNLOAD_PART_MB * MB,
    multipart_chunksize=DOWNLOAD_PART_MB * MB,
    max_concurrency=CONCURRENCY,
    io_chunksize=MB,
)


def split_s3_uri(uri: str) -> tuple[str, str]:
    location = S3Location.parse(uri)
    if len(location.bucket) < 3:
        raise StorageError(f"{uri}: bucket name must have at least 3 characters")
    return location.bucket, location.prefix


def _code(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "error"))
    return type(exc).__name__


class S3Storage:
    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = split_s3_uri(uri)
        self.client = boto3.client(
            "s3",
            config=Config(
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
                max_pool_connections=CONCURRENCY + 2,
            ),
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, what: str, exc: Exception) -> StorageError:
        return StorageError(f"{self.uri}/{what}: {_code(exc)}")

    def upload(self, path: Path, key: str) -> None:
        self.upload_many([(path, key)])

    def download(self, key: str, path: Path) -> None:
        self.download_many([(key, path)])

    def upload_many(self, pairs: list[tuple[Path, str]]) -> None:
        """Upload files in parallel; raises StorageError naming the first failure (the rest are cancelled)."""
        for path, _ in pairs:
            if not Path(path).is_file():
                raise StorageError(f"{path}: not found")
        self._transfer(
            UPLOAD, [(key, lambda m, p=path, k=key: m.upload(str(p), self.bucket, self._key(k))) for path, key in pairs]
        )

    def download_many(self, pairs: list[tuple[str, Path]]) -> None:
        """Download files in parallel (each written to a temporary name, then renamed)."""
        for _, path in pairs:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._transfer(
            DOWNLOAD,
            [(key, lambda m, k=key, p=path: m.download(self.bucket, self._key(k), str(p))) for key, path in pairs],
        )

    def _transfer(self, config: TransferConfig, submits: list) -> None:
        if not submits:
            return
        failure: StorageError | None = None
        with create_transfer_manager(self.client, config) as manager:
            futures = [(key, submit(manager)) for key, submit in submits]
            for index, (key, future) in enumerate(futures):
                try:
                    future.result()
                except Exception as exc:  # botocore, s3transfer and OS errors all mean: not transferred
                    if failure is None:
                        failure = self._fail(key, exc)
                        for _, other in futures[index + 1 :]:
                            other.cancel()
        if failure is not None:
            raise failure

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

    def _folder(self, prefix: str) -> str:
        # a prefix names a folder: listing run-1 must not return run-10
        if prefix:
            return self._key(prefix.rstrip("/") + "/")
        return f"{self.prefix}/" if self.prefix else ""

    def _strip(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def list(self, prefix: str = "") -> list[str]:
        keys = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=self.bucket, Prefix=self._folder(prefix))
            for page in pages:
                keys.extend(self._strip(obj["Key"]) for obj in page.get("Contents", []))
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

    def list_incomplete(self, prefix: str = "") -> list[Incomplete]:
        """Multipart uploads under `prefix` that were started and never completed or aborted."""
        found = []
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self._folder(prefix)
            )
            for page in pages:
                found.extend(Incomplete(self._strip(u["Key"]), u["UploadId"]) for u in page.get("Uploads", []))
        except (BotoCoreError, ClientError) as exc:
            raise self._fail(prefix, exc) from None
        return sorted(found, key=lambda item: (item.key, item.upload_id))

    def abort_incomplete(self, items: list[Incomplete]) -> None:
        for item in items:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(item.key), UploadId=item.upload_id)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                    raise self._fail(item.key, exc) from None
            except BotoCoreError as exc:
                raise self._fail(item.key, exc) from None

    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "error")
            reason = "bucket does not exist" if code in ("404", "NoSuchBucket") else f"not accessible ({code})"
            raise StorageError(f"{self.uri}: {reason}") from None
        except BotoCoreError as exc:
            raise StorageError(f"{self.uri}: S3 endpoint unreachable ({type(exc).__name__})") from None
