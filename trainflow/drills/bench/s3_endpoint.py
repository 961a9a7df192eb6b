"""The S3-compatible endpoint the checkpoint benchmark measures against: `--uri`, else the bucket
`trainflow-bench` on the endpoint the AWS environment names, else a moto_server of its own on a
free loopback port, at a low CPU priority (it stands in for a store that is not on the training
node), stopped at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from trainflow.checkpoint.location import is_s3
from trainflow.drills.servers import ServerError, stop_server, wait_http

BUCKET = "trainflow-bench"
SERVER_NICENESS = 19


class BenchError(RuntimeError):
    """The benchmark could not run (no S3 server, an unusable URI); the message says why."""


@contextmanager
def s3_store(uri: str | None, log):
    """(checkpoint URI, endpoint description): `--uri`; else the bucket `trainflow-bench` on the
    endpoint the AWS environment configures; else a bucket on an own moto_server."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if uri is None and endpoint is None:
        with _moto_server(log) as own:
            yield f"s3://{BUCKET}/checkpoints", f"{own} (moto_server started by the benchmark)"
        return
    if uri is not None and not is_s3(uri):
        raise BenchError(f"--uri {uri!r}: the benchmark needs an s3://bucket/prefix URI")
    uri = (uri or f"s3://{BUCKET}/checkpoints").rstrip("/")
    from trainflow.checkpoint.s3 import S3Storage
    from trainflow.checkpoint.storage import StorageError

    try:
        S3Storage(uri).check()
    except StorageError as exc:
        hint = "pass --uri s3://bucket/prefix, or unset AWS_ENDPOINT_URL_S3 for a moto_server of its own"
        raise BenchError(f"{exc} ({hint})") from None
    yield uri, endpoint or "AWS S3"


@contextmanager
def _moto_server(log):
    import boto3

    from trainflow.backends.ports import free_port

    binary = Path(sys.executable).parent / "moto_server"
    if not binary.exists():
        found = shutil.which("moto_server")
        if found is None:
            raise BenchError("no S3 endpoint: pass --uri s3://bucket/prefix, or install moto[server] for moto_server")
        binary = Path(found)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log(f"starting moto_server on {endpoint}")
    # The server stands in for a store that is not on the training node: it gets the CPU that
    # training leaves. Our uploads and the plain boto3 yardstick talk to the same server.
    proc = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: os.nice(SERVER_NICENESS),
    )
    overrides = {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "trainflow-bench",
        "AWS_SECRET_ACCESS_KEY": "trainflow-bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in [*overrides, "AWS_PROFILE"]}
    try:
        try:
            wait_http(f"{endpoint}/moto-api/", proc, timeout_s=60)
        except ServerError as exc:
            raise BenchError(f"moto_server: {exc}") from None
        os.environ.update(overrides)
        os.environ.pop("AWS_PROFILE", None)
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop_server(proc, grace_s=10)
