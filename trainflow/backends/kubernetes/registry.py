"""Does an image exist in its registry, and under which digest? (OCI distribution API, HEAD manifest.)

Anonymous bearer tokens work for public repositories; private ones use the credentials of the
Docker config (`$DOCKER_CONFIG/config.json` or `~/.docker/config.json`, `auths.<registry>.auth`).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DOCKER_HUB = "registry-1.docker.io"
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
INSECURE_ENV = "TRAINFLOW_INSECURE_REGISTRIES"  # comma-separated hosts reached over plain HTTP


class RegistryError(RuntimeError):
    """The registry could not say whether the image exists."""


def split_repository(repository: str) -> tuple[str, str]:
    """(registry host, repository path) as the distribution API names them."""
    first, _, rest = repository.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return DOCKER_HUB, repository if rest else f"library/{repository}"


def _scheme(host: str) -> str:
    insecure = {h.strip() for h in os.environ.get(INSECURE_ENV, "").split(",") if h.strip()}
    local = host.split(":")[0] in ("localhost", "127.0.0.1")
    return "http" if local or host in insecure else "https"


def _basic_auth(host: str) -> str | None:
    config_dir = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    try:
        auths = json.loads((config_dir / "config.json").read_text()).get("auths", {})
    except (OSError, ValueError):
        return None
    for key in (host, f"https://{host}", "https://index.docker.io/v1/" if host == DOCKER_HUB else None):
        entry = auths.get(key) if key else None
        if entry and entry.get("auth"):
            return f"Basic {entry['auth']}"
    return None


def _bearer_token(challenge: str, basic: str | None, timeout: float) -> str:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        raise RegistryError(f"registry asked for a token without a realm: {challenge}")
    request = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(params)}")
    if basic:
        request.add_header("Authorization", basic)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, ValueError) as exc:
        raise RegistryError(f"could not get a registry token from {realm}: {exc}") from None
    token = body.get("token") or body.get("access_token")
    if not token:
        raise RegistryError(f"{realm} returned no token")
    return f"Bearer {token}"


def manifest_digest(repository: str, tag: str, timeout: float = 10.0) -> str | None:
    """The digest of `repository:tag`, or None when the registry says it does not exist."""
    host, path = split_repository(repository)
    url = f"{_scheme(host)}://{host}/v2/{path}/manifests/{tag}"
    basic = _basic_auth(host)
    authorization = None
    for _ in range(2):
        request = urllib.request.Request(url, method="HEAD", headers={"Accept": MANIFEST_TYPES})
        if authorization:
            request.add_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                digest = response.headers.get("Docker-Content-Digest")
                if not digest:
                    raise RegistryError(f"{url}: the registry sent no Docker-Content-Digest header")
                return digest
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            challenge = exc.headers.get("WWW-Authenticate", "")
            if exc.code == 401 and authorization is None:
                authorization = _bearer_token(challenge, basic, timeout) if challenge.startswith("Bearer") else basic
                if authorization:
                    continue
            raise RegistryError(
                f"{url}: HTTP {exc.code}; check the image repository and the registry credentials (docker login {host})"
            ) from None
        except urllib.error.URLError as exc:
            raise RegistryError(f"{url}: registry unreachable ({exc.reason})") from None
    raise RegistryError(f"{url}: the registry refused the credentials (docker login {host})")
