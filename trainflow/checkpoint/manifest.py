"""The manifest is the commit: a checkpoint exists only once its manifest is written, last."""

from __future__ import annotations

import hashlib
import json
import time
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
        return manifest


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def describe_file(path: Path) -> FileEntry:
    return FileEntry(name=path.name, size=path.stat().st_size, sha256=sha256_file(path))


def verify_files(manifest: Manifest, folder: Path) -> list[str]:
    """Problems found comparing the files in `folder` with the manifest; empty when all match."""
    problems = []
    for entry in manifest.files:
        path = folder / entry.name
        if not path.is_file():
            problems.append(f"{entry.name}: missing")
        elif path.stat().st_size != entry.size:
            problems.append(f"{entry.name}: size {path.stat().st_size} != {entry.size}")
        elif sha256_file(path) != entry.sha256:
            problems.append(f"{entry.name}: sha256 mismatch")
    return problems
