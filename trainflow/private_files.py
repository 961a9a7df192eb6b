"""Files and folders only their owner can read: whatever holds the status token or a secret.

Files are created with mode 0600 from the start (never widened first and narrowed afterwards),
so there is no moment at which another local user could open them. Folders are created 0700, and
one that was there already is used only if it is this user's own folder, not a link, and no one
else can write to it: another user who made it first would own whatever is put in it.

A `volume` is a folder only this node's processes can reach whatever its mode: a Kubernetes pod's
emptyDir, which the kubelet makes 0777 and no other pod mounts. Folders are made in it without the
shared-folder check (no one else is there to replace them) and are checked once made, as always.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600


class UnsafeFolder(PermissionError):
    """A folder trainflow would keep private things in that another user could reach."""


def private_folder(path: Path, volume: Path | None = None) -> Path:
    """Create `path`, and any missing parent, readable and enterable by the owner only. A `path`
    that exists already must be this user's own folder (not a link) that no one else can write to;
    one only others could read is narrowed to 0700, anything else is refused (UnsafeFolder)."""
    make_folders(path, volume)
    info = os.lstat(path)
    _check_own_folder(path, info)
    if stat.S_IMODE(info.st_mode) & 0o022:
        raise UnsafeFolder(
            f"{path}: others can write to this folder (mode {stat.S_IMODE(info.st_mode):04o}); "
            "remove it, or make it 0700, before running again"
        )
    if stat.S_IMODE(info.st_mode) != PRIVATE_FOLDER:
        os.chmod(path, PRIVATE_FOLDER, follow_symlinks=False)
    return path


def make_folders(path: Path, volume: Path | None = None) -> Path:
    """Create the missing folders of `path`, each 0700 and checked to be this user's own folder
    once made (another user may have made it first); folders that existed are left as they are."""
    missing = [folder for folder in (path, *path.parents) if not os.path.lexists(folder)]
    if missing and missing[-1].parent != volume:
        _check_safe_to_create_in(missing[-1].parent)
    for folder in reversed(missing):
        folder.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
        _check_own_folder(folder, os.lstat(folder))
    if not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    return path


def _check_safe_to_create_in(parent: Path) -> None:
    """What is made in a folder everyone can write to, unless it is sticky (as /tmp is), can be moved
    away and replaced by anyone."""
    info = os.stat(parent)
    if info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX:
        raise UnsafeFolder(
            f"{parent}: anyone can replace what trainflow makes in this folder (mode "
            f"{stat.S_IMODE(info.st_mode):04o}); choose a folder of your own"
        )


def _check_own_folder(path: Path, info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolder(
            f"{path}: a {'symbolic link' if stat.S_ISLNK(info.st_mode) else 'file'} where trainflow "
            "keeps a private folder; remove it before running again"
        )
    if info.st_uid != os.geteuid():
        raise UnsafeFolder(
            f"{path}: owned by uid {info.st_uid}, not by this user (uid {os.geteuid()}); "
            "trainflow keeps private files only in its own folders: remove it, or choose another one"
        )


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
