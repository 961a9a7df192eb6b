"""trainflow.checkpoint.storage.LocalStorage: the local checkpoint store."""

from __future__ import annotations

import os
import subprocess

import pytest

from trainflow.checkpoint.storage import AlreadyExists, Incomplete, LocalStorage, StorageError, open_storage


@pytest.fixture
def store(tmp_path) -> LocalStorage:
    return LocalStorage(tmp_path / "store")


def test_upload_then_download(store, tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"\x00\x01payload")
    store.upload(source, "run/step-1/model.bin")
    target = tmp_path / "out" / "deep" / "model.bin"
    store.download("run/step-1/model.bin", target)
    assert target.read_bytes() == b"\x00\x01payload"
    assert store.read("run/step-1/model.bin") == b"\x00\x01payload"
    assert store.size("run/step-1/model.bin") == 9


def test_upload_overwrites_and_leaves_no_partial_file(store, tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"one")
    store.upload(source, "a/f")
    source.write_bytes(b"second")
    store.upload(source, "a/f")
    assert store.read("a/f") == b"second"
    assert os.listdir(store.root / "a") == ["f"]


def test_missing_key(store, tmp_path):
    assert store.size("nope") is None
    with pytest.raises(StorageError, match="not found"):
        store.read("nope")
    with pytest.raises(StorageError, match="not found"):
        store.download("nope", tmp_path / "x")


def test_size_of_a_folder_is_none(store):
    store.put_if_absent("a/b/f", b"x")
    assert store.size("a/b") is None


def test_put_if_absent_commits_once(store):
    store.put_if_absent("run/manifest.json", b"first")
    with pytest.raises(AlreadyExists):
        store.put_if_absent("run/manifest.json", b"second")
    assert store.read("run/manifest.json") == b"first"
    assert store.list() == ["run/manifest.json"]  # the losing writer's temp file is gone


def test_already_exists_is_a_storage_error():
    assert issubclass(AlreadyExists, StorageError)


def test_list_is_sorted_relative_and_prefix_limited(store):
    for key in ["b/2", "a/1", "a/sub/3", "c"]:
        store.put_if_absent(key, b"x")
    assert store.list() == ["a/1", "a/sub/3", "b/2", "c"]
    assert store.list("a") == ["a/1", "a/sub/3"]
    assert store.list("missing") == []


def test_list_of_a_store_that_does_not_exist_yet(tmp_path):
    assert LocalStorage(tmp_path / "never-created").list() == []


def test_list_ignores_files_being_written(store):
    store.put_if_absent("run/step-1/model.bin", b"x")
    (store.root / "run" / "step-1" / "other.bin.partial-1234").write_bytes(b"half")
    assert store.list() == ["run/step-1/model.bin"]


def test_delete_removes_files_and_emptied_folders(store):
    store.put_if_absent("run/step-1/a", b"x")
    store.put_if_absent("run/step-1/b", b"x")
    store.put_if_absent("run/step-2/a", b"x")
    store.delete(["run/step-1/a"])
    assert (store.root / "run" / "step-1").is_dir()  # still holds b
    store.delete(["run/step-1/b"])
    assert not (store.root / "run" / "step-1").exists()
    assert store.list() == ["run/step-2/a"]
    store.delete(["run/step-2/a"])
    assert not (store.root / "run").exists()
    assert store.root.is_dir()  # the root itself stays


def test_delete_of_missing_keys_is_quiet(store):
    store.delete(["not/there"])
    assert store.list() == []


def test_check_creates_the_root(store):
    store.check()
    assert store.root.is_dir()


def test_check_under_a_regular_file_fails(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StorageError, match="cannot create checkpoint directory"):
        LocalStorage(blocker / "checkpoints").check()


def test_check_on_a_regular_file_fails(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StorageError):
        LocalStorage(blocker).check()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_check_on_read_only_folder_fails(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(StorageError, match="not writable"):
            LocalStorage(root).check()
    finally:
        root.chmod(0o700)


def test_open_storage_local(tmp_path):
    store = open_storage(str(tmp_path))
    assert isinstance(store, LocalStorage)
    assert store.uri == str(tmp_path)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (root only), unmounted whatever happens."""
    mountpoint = tmp_path / "tmpfs"
    mountpoint.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mountpoint)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs (needs root)")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


def test_a_full_folder_is_a_storage_error_that_leaves_no_partial_file(small_tmpfs, tmp_path):
    store = LocalStorage(small_tmpfs)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(2 << 20))
    with pytest.raises(StorageError, match="No space left on device"):
        store.upload(big, "run/step-00000010/__0_0.distcp")
    assert store.list_incomplete() == [] and store.list() == []


def test_a_folder_turned_read_only_is_a_storage_error_for_every_write(small_tmpfs, tmp_path):
    store = LocalStorage(small_tmpfs)
    store.put_if_absent("run/step-00000010/manifest.json", b"{}")
    source = tmp_path / "shard"
    source.write_bytes(b"x" * 100)
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    assert store.read("run/step-00000010/manifest.json") == b"{}"  # reading still works
    for write in (
        lambda: store.upload(source, "run/step-00000020/shard"),
        lambda: store.put_if_absent("run/step-00000020/manifest.json", b"{}"),
        lambda: store.delete(["run/step-00000010/manifest.json"]),
        lambda: store.abort_incomplete([Incomplete("run/step-00000010/manifest.json")]),
    ):
        with pytest.raises(StorageError, match="Read-only file system"):
            write()


def test_an_s3_uri_is_parsed_once_into_bucket_and_prefix():
    from trainflow.checkpoint.location import S3Location, is_s3

    location = S3Location.parse("s3://ckpt-bucket/team/runs/")
    assert (location.bucket, location.prefix) == ("ckpt-bucket", "team/runs")
    assert location.key("run-1", "/step-10/") == "team/runs/run-1/step-10"
    assert S3Location.parse("s3://ckpt-bucket").key("a") == "a" and location.uri == "s3://ckpt-bucket/team/runs"
    assert is_s3("s3://b/p") and not is_s3("/tmp/ckpt") and not is_s3("file:///tmp/ckpt")
