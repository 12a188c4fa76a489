"""Where the watch writes, in one place: private folders (0700) and private files (0600),
created new, never through a link. The creating is done by `private_files` (the one
helper every writer uses); this module adds what the watch asks of its evidence root.

The evidence root and everything under it are the user's own; a file is written to a new
temporary name and renamed into place, so a reader never sees half a file and nothing that
another user placed there (a link, a FIFO) is written through.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from areal_console.core.common import private_files


class NotPrivate(OSError):
    """A folder the watch would write in is not a real folder of this user."""


@contextmanager
def _refused() -> Iterator[None]:
    try:
        yield
    except private_files.UnsafePath as exc:
        raise NotPrivate(str(exc)) from None


def private_root(path: Path) -> Path:
    """`path` as a folder of this user (made 0700 when it is missing, with its parents);
    NotPrivate when it is a link, not a folder, or another user's."""
    path = Path(os.path.abspath(path))
    if os.path.islink(path):
        raise NotPrivate(f"{path} is a symbolic link")
    with _refused():
        private_files.private_dir(path)
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
    if os.path.lexists(path):
        raise FileExistsError(f"{path} exists already")
    with _refused():
        return private_files.new_dir(path)


def write_private(folder: Path, name: str, data: bytes) -> Path:
    """`folder/name` holds `data`, mode 0600: written to a new temporary file in the folder
    and renamed over `name` (a link there is replaced, never written through)."""
    check_private_dir(folder)
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not a file name: {name!r}")
    with _refused():
        return private_files.replace(folder / name, data, durable=True)


def probe_writable(folder: Path) -> None:
    """Raise OSError when no file can be created in `folder` (a read-only file system, a
    full disk, no permission); leaves nothing behind."""
    path = write_private(folder, ".watch-probe", b"")
    os.unlink(path)
