"""What every checkpoint store offers (`Storage`), whatever holds the files, and the errors it raises.
The stores themselves: `LocalStorage` and `open_storage` in trainflow.checkpoint.storage, `S3Storage`
in trainflow.checkpoint.s3."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class StorageError(RuntimeError):
    """The checkpoint store could not be read or written."""


class AlreadyExists(StorageError):
    """A conditional write found the key already present."""


@dataclass(frozen=True)
class Incomplete:
    """An upload that was started and never finished: a multipart upload, or a partial file."""

    key: str
    upload_id: str = ""


class Storage(Protocol):
    uri: str

    def upload(self, path: Path, key: str) -> None: ...
    def download(self, key: str, path: Path) -> None: ...
    def upload_many(self, pairs: list[tuple[Path, str]]) -> None: ...
    def download_many(self, pairs: list[tuple[str, Path]]) -> None: ...
    def put_if_absent(self, key: str, data: bytes) -> None: ...
    def read(self, key: str) -> bytes: ...
    def size(self, key: str) -> int | None: ...
    def list(self, prefix: str = "") -> list[str]: ...
    def delete(self, keys: list[str]) -> None: ...
    def list_incomplete(self, prefix: str = "") -> list[Incomplete]: ...
    def abort_incomplete(self, items: list[Incomplete]) -> None: ...
    def check(self) -> None: ...
