"""The manifest is the commit: a checkpoint exists only once its manifest is written, last."""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


class ManifestError(ValueError):
    """A manifest that is missing, unreadable or does not match its files."""


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    spec_hash: str
    code_version: str
    run_id: str
    files: tuple[FileEntry, ...]
    committed_at: float = field(default_factory=time.time)
    format_version: int = FORMAT_VERSION

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    def entry(self, name: str) -> FileEntry | None:
        return next((f for f in self.files if f.name == name), None)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            files = tuple(FileEntry(**f) for f in raw.pop("files"))
            manifest = cls(files=files, **raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise ManifestError(f"manifest is not readable: {exc}") from None
        if manifest.format_version != FORMAT_VERSION:
            raise ManifestError(f"manifest format {manifest.format_version} is not {FORMAT_VERSION}")
        if not manifest.files:
            raise ManifestError("manifest lists no files")
        for entry in manifest.files:
            _check_entry(entry)
        return manifest


def _check_entry(entry: FileEntry) -> None:
    # names become local paths on restore: a plain file name only, never a way out of the folder
    name = entry.name
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ManifestError(f"manifest lists an unsafe file name {name!r}")
    if not isinstance(entry.size, int) or isinstance(entry.size, bool) or entry.size < 0:
        raise ManifestError(f"{name}: size {entry.size!r} is not a byte count")
    if not isinstance(entry.sha256, str) or len(entry.sha256) != 64:
        raise ManifestError(f"{name}: sha256 {entry.sha256!r} is not a sha256 hex digest")


def sha256_file(path: Path, chunk: int = 4 << 20) -> str:
    # hashlib releases the GIL on large blocks, so hashing in a background thread leaves training alone
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def describe_file(path: Path) -> FileEntry:
    return FileEntry(name=path.name, size=path.stat().st_size, sha256=sha256_file(path))


def check_file(entry: FileEntry, folder: Path) -> str | None:
    """What is wrong with one file against its manifest entry, or None when it matches."""
    path = folder / entry.name
    if not path.is_file():
        return f"{entry.name}: missing"
    size = path.stat().st_size
    if size != entry.size:
        return f"{entry.name}: size {size} != {entry.size}"
    if sha256_file(path) != entry.sha256:
        return f"{entry.name}: sha256 mismatch"
    return None


def verify_files(manifest: Manifest, folder: Path, names: set[str] | None = None, workers: int = 2) -> list[str]:
    """Problems found comparing the files in `folder` (all, or only `names`) with the manifest, in
    manifest order; empty when all match."""
    entries = [e for e in manifest.files if names is None or e.name in names]
    if workers > 1 and len(entries) > 1:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trainflow-verify") as pool:
            found = list(pool.map(lambda e: check_file(e, folder), entries))
    else:
        found = [check_file(e, folder) for e in entries]
    return [problem for problem in found if problem is not None]
