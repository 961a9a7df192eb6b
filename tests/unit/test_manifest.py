"""trainflow.checkpoint.manifest: the commit record of a checkpoint and file verification."""

from __future__ import annotations

import hashlib
import json

import pytest

from trainflow.checkpoint.manifest import (
    FORMAT_VERSION,
    FileEntry,
    Manifest,
    ManifestError,
    describe_file,
    verify_files,
)


def make_manifest(files: tuple[FileEntry, ...]) -> Manifest:
    return Manifest(step=40, world_size=2, spec_hash="ab" * 32, code_version="1234abcd", run_id="run-a", files=files)


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"model-bytes" * 100)
    (tmp_path / "state.json").write_text('{"step": 40}')
    return tmp_path


@pytest.fixture
def manifest(folder) -> Manifest:
    return make_manifest((describe_file(folder / "model.pt"), describe_file(folder / "state.json")))


def test_round_trip(manifest):
    again = Manifest.from_json(manifest.to_json())
    assert again == manifest
    assert again.files[0] == manifest.files[0]
    assert again.total_bytes == manifest.total_bytes == 1100 + len('{"step": 40}')


def test_round_trip_from_bytes(manifest):
    assert Manifest.from_json(manifest.to_json().encode()) == manifest


@pytest.mark.parametrize("text", ["garbage", "", "{}", '{"files": [1]}', "[]", '{"step": 1}'])
def test_garbage_is_a_manifest_error(text):
    with pytest.raises(ManifestError):
        Manifest.from_json(text)


@pytest.mark.parametrize("text", ["null", '"text"', "5"])
def test_json_scalar_is_a_manifest_error(text):
    with pytest.raises(ManifestError):
        Manifest.from_json(text)


def test_no_files_is_refused(manifest):
    raw = json.loads(manifest.to_json())
    raw["files"] = []
    with pytest.raises(ManifestError, match="no files"):
        Manifest.from_json(json.dumps(raw))


def test_missing_files_key_is_refused(manifest):
    raw = json.loads(manifest.to_json())
    del raw["files"]
    with pytest.raises(ManifestError):
        Manifest.from_json(json.dumps(raw))


def test_wrong_format_version_is_refused(manifest):
    raw = json.loads(manifest.to_json())
    raw["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(ManifestError, match="format"):
        Manifest.from_json(json.dumps(raw))


def test_unknown_field_is_refused(manifest):
    raw = json.loads(manifest.to_json())
    raw["extra"] = 1
    with pytest.raises(ManifestError):
        Manifest.from_json(json.dumps(raw))


def test_describe_file_size_and_sha256(folder):
    path = folder / "model.pt"
    entry = describe_file(path)
    assert entry.name == "model.pt"
    assert entry.size == path.stat().st_size == 1100
    assert entry.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_describe_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert describe_file(path) == FileEntry("empty", 0, hashlib.sha256(b"").hexdigest())


def test_describe_file_larger_than_one_read_chunk(tmp_path):
    data = bytes(range(256)) * 5000  # > 1 MiB chunk
    path = tmp_path / "big"
    path.write_bytes(data)
    assert describe_file(path).sha256 == hashlib.sha256(data).hexdigest()


def test_verify_files_all_match(manifest, folder):
    assert verify_files(manifest, folder) == []


def test_verify_files_reports_missing(manifest, folder):
    (folder / "state.json").unlink()
    assert verify_files(manifest, folder) == ["state.json: missing"]


def test_verify_files_reports_truncated(manifest, folder):
    path = folder / "model.pt"
    path.write_bytes(path.read_bytes()[:-10])
    assert verify_files(manifest, folder) == ["model.pt: size 1090 != 1100"]


def test_verify_files_reports_flipped_byte(manifest, folder):
    path = folder / "model.pt"
    data = bytearray(path.read_bytes())
    data[500] ^= 0xFF
    path.write_bytes(bytes(data))
    assert verify_files(manifest, folder) == ["model.pt: sha256 mismatch"]


def test_verify_files_reports_every_problem(manifest, folder):
    (folder / "model.pt").unlink()
    (folder / "state.json").write_text("{}")
    problems = verify_files(manifest, folder)
    assert len(problems) == 2
    assert problems[0] == "model.pt: missing"
    assert problems[1].startswith("state.json: size")
