"""Checkpoint storage over string URIs: a local directory or s3://bucket/prefix (boto3).

Keys are '/'-separated paths below the root. `put_if_absent` is the commit primitive: it never
overwrites, so two writers cannot both commit the same checkpoint. `upload_many`/`download_many`
move a checkpoint's files in parallel; `list_incomplete`/`abort_incomplete` find and drop what an
interrupted writer left behind (multipart uploads on S3, partial files on disk).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainflow.checkpoint.location import is_s3
from trainflow.checkpoint.store import AlreadyExists, Incomplete, Storage, StorageError
from trainflow.private_files import make_folders

PARTIAL = ".partial-"  # suffix of a file still being written


@contextmanager
def _as_storage_error(where: str) -> Iterator[None]:
    """A local file system fault (full, read-only, gone) is a storage fault like any S3 one."""
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"{where}: {exc.strerror or exc}") from None


def _partial_name(target: Path) -> Path:
    return target.with_name(f"{target.name}{PARTIAL}{os.getpid()}-{threading.get_ident()}")


class LocalStorage:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def upload(self, path: Path, key: str) -> None:
        target = self._path(key)
        partial = _partial_name(target)
        try:
            make_folders(target.parent)  # new folders 0700: a checkpoint is its owner's
            shutil.copyfile(path, partial)
            with open(partial, "rb") as handle:
                os.fsync(handle.fileno())  # the durable tier: on disk before the manifest names it
            os.replace(partial, target)
        except FileNotFoundError:
            partial.unlink(missing_ok=True)
            raise StorageError(f"{path}: not found") from None
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise StorageError(f"{self.uri}/{key}: {exc.strerror or exc}") from None

    def upload_many(self, pairs: list[tuple[Path, str]]) -> None:
        for path, key in pairs:
            self.upload(path, key)

    def download_many(self, pairs: list[tuple[str, Path]]) -> None:
        for key, path in pairs:
            self.download(key, path)

    def download(self, key: str, path: Path) -> None:
        with _as_storage_error(f"{self.uri}/{key}"):
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(self._path(key), path)
            except FileNotFoundError:
                raise StorageError(f"{self.uri}/{key}: not found") from None

    def put_if_absent(self, key: str, data: bytes) -> None:
        target = self._path(key)
        with _as_storage_error(f"{self.uri}/{key}"):
            make_folders(target.parent)
            partial = _partial_name(target)
            try:
                with open(partial, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.link(partial, target)  # link() fails if the target exists: an atomic create-if-absent
            except FileExistsError:
                raise AlreadyExists(f"{self.uri}/{key} already exists") from None
            finally:
                partial.unlink(missing_ok=True)

    def read(self, key: str) -> bytes:
        with _as_storage_error(f"{self.uri}/{key}"):
            try:
                return self._path(key).read_bytes()
            except FileNotFoundError:
                raise StorageError(f"{self.uri}/{key}: not found") from None

    def size(self, key: str) -> int | None:
        path = self._path(key)
        with _as_storage_error(f"{self.uri}/{key}"):
            return path.stat().st_size if path.is_file() else None

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        with _as_storage_error(f"{self.uri}/{prefix}"):
            if not base.exists():
                return []
            return sorted(
                str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and PARTIAL not in p.name
            )

    def delete(self, keys: list[str]) -> None:
        with _as_storage_error(self.uri):
            for key in keys:
                self._path(key).unlink(missing_ok=True)
            for key in keys:  # drop folders the deletes emptied
                parent = self._path(key).parent
                while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
                    parent.rmdir()
                    parent = parent.parent

    def list_incomplete(self, prefix: str = "") -> list[Incomplete]:
        base = self._path(prefix) if prefix else self.root
        with _as_storage_error(f"{self.uri}/{prefix}"):
            if not base.exists():
                return []
            return sorted(
                (Incomplete(str(p.relative_to(self.root))) for p in base.rglob(f"*{PARTIAL}*") if p.is_file()),
                key=lambda item: item.key,
            )

    def abort_incomplete(self, items: list[Incomplete]) -> None:
        with _as_storage_error(self.uri):
            for item in items:
                self._path(item.key).unlink(missing_ok=True)

    def check(self) -> None:
        try:
            make_folders(self.root)
        except OSError as exc:
            raise StorageError(f"{self.uri}: cannot create checkpoint directory ({exc.strerror or exc})") from None
        if not os.access(self.root, os.W_OK):
            raise StorageError(f"{self.uri}: checkpoint directory is not writable")


def open_storage(uri: str) -> Storage:
    if is_s3(uri):
        from trainflow.checkpoint.s3 import S3Storage  # boto3 only where S3 is used

        return S3Storage(uri)
    return LocalStorage(uri)
