"""Where the watch writes, in one place: private folders (0700) and private files (0600),
created new (`O_EXCL`), never through a link.

The evidence root and everything under it are the user's own; a file is written to a new
temp name and renamed into place, so a reader never sees half a file and nothing that
another user placed there (a link, a FIFO) is written through.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


class NotPrivate(OSError):
    """A folder the watch would write in is not a real folder of this user."""


def private_root(path: Path) -> Path:
    """`path` as a folder of this user (made 0700 when it is missing, with its parents);
    NotPrivate when it is a link, not a folder, or another user's."""
    path = Path(os.path.abspath(path))
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
            os.mkdir(path, PRIVATE_DIR)
    check_private_dir(path)
    return path


def check_private_dir(path: Path) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise NotPrivate(f"{path} is a symbolic link")
    if not stat.S_ISDIR(info.st_mode):
        raise NotPrivate(f"{path} is not a folder")
    if info.st_uid != os.getuid():
        raise NotPrivate(f"{path} belongs to another user (uid {info.st_uid})")


def new_private_dir(parent: Path, name: str) -> Path:
    """A new folder `parent/name`, 0700 (FileExistsError when the name is taken)."""
    check_private_dir(parent)
    path = parent / name
    os.mkdir(path, PRIVATE_DIR)
    os.chmod(path, PRIVATE_DIR, follow_symlinks=False)  # the umask may have taken bits
    return path


def write_private(folder: Path, name: str, data: bytes) -> Path:
    """`folder/name` holds `data`, mode 0600: written to a new temp file (O_EXCL, no link
    followed) in the folder and renamed over `name`. The one function that writes files."""
    check_private_dir(folder)
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not a file name: {name!r}")
    tmp = folder / f".{name}.{os.urandom(4).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return folder / name


def probe_writable(folder: Path) -> None:
    """Raise OSError when no file can be created in `folder` (a read-only file system, a
    full disk, no permission); leaves nothing behind."""
    path = write_private(folder, ".watch-probe", b"")
    os.unlink(path)
