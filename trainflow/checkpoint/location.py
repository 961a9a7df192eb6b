"""Checkpoint URIs, parsed in one place: s3://bucket/prefix, or a local folder (a path or file://PATH)."""

from __future__ import annotations

from dataclasses import dataclass

S3_SCHEME = "s3://"


def is_s3(uri: str) -> bool:
    return uri.startswith(S3_SCHEME)


def is_remote(uri: str) -> bool:
    """A store off this machine (S3): every node and the orchestrator share it, files reach it over
    the network (which can fail for a while), and its URI means the same everywhere. Anything else is
    a folder on this machine's disk."""
    return is_s3(uri)


@dataclass(frozen=True)
class S3Location:
    """A bucket and the key prefix under it (no leading or trailing slash)."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        if not is_s3(uri):
            raise ValueError(f"{uri!r} is not an s3:// URI")
        bucket, _, prefix = uri.removeprefix(S3_SCHEME).partition("/")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        """The key of `parts` under the prefix."""
        return "/".join(part.strip("/") for part in (self.prefix, *parts) if part.strip("/"))

    @property
    def uri(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}".rstrip("/")
