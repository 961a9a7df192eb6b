"""Files and folders only their owner can read: whatever holds the status token or a secret.

Files are created with mode 0600 from the start (never widened first and narrowed afterwards),
so there is no moment at which another local user could open them.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600


def private_folder(path: Path) -> Path:
    """Create `path`, and any missing parent, readable and enterable by the owner only."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
    return path


def open_private(path: Path, append: bool = False) -> int:
    """A file descriptor for writing `path`, created 0600. Without `append` any previous file is
    replaced by a new one (a file made by someone else, or with a wider mode, is never reused)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    if append:
        flags |= os.O_APPEND
    else:
        path.unlink(missing_ok=True)
        flags |= os.O_EXCL
    return os.open(path, flags, PRIVATE_FILE)


def write_private(path: Path, text: str) -> Path:
    """Write `text` to a new 0600 file at `path` (its folder must exist)."""
    with os.fdopen(open_private(path), "w") as handle:
        handle.write(text)
    return path
