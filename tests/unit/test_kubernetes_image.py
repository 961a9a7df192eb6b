"""The worker image: references, the tag derived from the lock file and code, the build context,
and the registry lookup against a real HTTP registry stand-in on loopback (anonymous bearer
token flow, as Docker Hub and most registries do it)."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trainflow.backends.kubernetes.image import (
    ImageError,
    ImageRef,
    context_files,
    context_tarball,
    derived_tag,
    pushed_digest,
)
from trainflow.backends.kubernetes.registry import RegistryError, manifest_digest, split_repository

DIGEST = "sha256:" + "ef" * 32


@pytest.mark.parametrize(
    "text, repository, tag, digest",
    [
        ("registry.example.com/ml/trainflow", "registry.example.com/ml/trainflow", None, None),
        ("registry.example.com:5000/ml/trainflow:v1", "registry.example.com:5000/ml/trainflow", "v1", None),
        (f"ghcr.io/acme/trainflow@{DIGEST}", "ghcr.io/acme/trainflow", None, DIGEST),
        (f"ghcr.io/acme/trainflow:v2@{DIGEST}", "ghcr.io/acme/trainflow", "v2", DIGEST),
    ],
)
def test_image_references_parse(text, repository, tag, digest):
    image = ImageRef.parse(text)
    assert (image.repository, image.tag, image.digest) == (repository, tag, digest)
    assert image.pinned == bool(tag or digest)


@pytest.mark.parametrize(
    "repository, host, path",
    [
        ("python", "registry-1.docker.io", "library/python"),
        ("acme/trainflow", "registry-1.docker.io", "acme/trainflow"),
        ("localhost:5000/trainflow", "localhost:5000", "trainflow"),
        ("registry.example.com/ml/trainflow", "registry.example.com", "ml/trainflow"),
    ],
)
def test_registry_and_path_of_a_repository(repository, host, path):
    assert split_repository(repository) == (host, path)


@pytest.fixture
def project(tmp_path):
    """A small git project with a lock file, a Dockerfile, code, tests and an ignored folder."""
    files = {
        "requirements.lock": "torch==2.13.0\n",
        "infra/Dockerfile": "FROM python:3.11-slim\n",
        "trainflow/__init__.py": "",
        "tests/test_x.py": "def test(): pass\n",
        ".gitignore": ".venv/\n",
        ".venv/lib.py": "ignored\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def test_build_context_is_what_git_sees_minus_tests(project):
    assert context_files(project) == [".gitignore", "infra/Dockerfile", "requirements.lock", "trainflow/__init__.py"]


def test_build_context_needs_the_lock_and_the_dockerfile(project):
    (project / "requirements.lock").unlink()
    with pytest.raises(ImageError, match="lacks requirements.lock"):
        context_files(project)


def test_tag_follows_the_lock_and_code_and_nothing_else(project):
    tag = derived_tag(project, context_files(project), "cpu")
    assert tag.startswith("tf-cpu-") and tag == derived_tag(project, context_files(project), "cpu")
    assert derived_tag(project, context_files(project), "cuda") != tag
    (project / "tests" / "test_x.py").write_text("def test(): assert True\n")
    assert derived_tag(project, context_files(project), "cpu") == tag
    (project / "requirements.lock").write_text("torch==2.13.1\n")
    assert derived_tag(project, context_files(project), "cpu") != tag


def test_context_tarball_is_reproducible_and_complete(project):
    files = context_files(project)
    first = context_tarball(project, files)
    assert first == context_tarball(project, files)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(first))) as tar:
        assert tar.getnames() == files and all(m.mtime == 0 for m in tar.getmembers())


def test_digest_is_read_from_kanikos_termination_message():
    done = {"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 0, "message": DIGEST + "\n"}}}]}}
    assert pushed_digest(done) == DIGEST
    assert pushed_digest({"status": {"containerStatuses": [{"state": {"running": {}}}]}}) is None


class Registry(BaseHTTPRequestHandler):
    """HEAD /v2/<repo>/manifests/<tag> behind an anonymous bearer token, like Docker Hub."""

    known = {"/v2/ml/trainflow/manifests/v1": DIGEST}

    def do_HEAD(self):
        if self.headers.get("Authorization") != "Bearer t0k3n":
            port = self.server.server_address[1]
            self.send_response(401)
            self.send_header(
                "WWW-Authenticate",
                f'Bearer realm="http://127.0.0.1:{port}/token",service="registry",scope="repository:ml/trainflow:pull"',
            )
            self.end_headers()
            return
        assert "application/vnd.oci.image.index.v1+json" in self.headers["Accept"]
        digest = self.known.get(self.path)
        self.send_response(200 if digest else 404)
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()

    def do_GET(self):
        assert self.path.startswith("/token?") and "scope=repository%3Aml%2Ftrainflow%3Apull" in self.path
        body = json.dumps({"token": "t0k3n"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def registry():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_registry_lookup_finds_the_digest_after_the_token_dance(registry, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert manifest_digest(f"{registry}/ml/trainflow", "v1") == DIGEST


def test_registry_lookup_of_a_missing_tag_is_none(registry, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert manifest_digest(f"{registry}/ml/trainflow", "tf-cpu-missing") is None


def test_unreachable_registry_is_an_error_that_names_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    with pytest.raises(RegistryError, match="registry unreachable"):
        manifest_digest("127.0.0.1:9/ml/trainflow", "v1", timeout=2)
