"""Every folder and file the console and the node agent create, made one way.

The rule: we write only under a folder that no other user can change (the data dir, the
cache dir, a fresh temporary folder, or a path the user named). A folder we need is made
0700 with `mkdir` (which fails on anything already there, as `O_EXCL` does for files);
a folder that already exists is accepted only when it, and every folder above it, is
owned by us or root and is not writable by others (a sticky folder such as /tmp is, but
what another user made inside it is not). A file is created `O_CREAT|O_EXCL|O_NOFOLLOW`
(never a link followed, never an existing file reused); replacing a file goes through a
fresh temporary file in the same private folder and `os.replace`.

Nothing here trusts a path component another user could swap: once the chain of folders
is checked, no other user can rename, replace or link anything in it.
The console uses this module through `areal_console.core.common.private_files` (its
errors there are the console's `UserError`). Standard library only; Python 3.9 reads it.
`tests/unit/test_write_contract.py` fails when a module of either package writes any
other way.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import IO, Any, Union

PathLike = Union[str, Path]

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafePath(OSError):
    """A folder or file we were asked to write in, which another user could change."""


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _check_folder(path: Path, st: os.stat_result, *, ours: bool) -> None:
    """A folder we may rely on: a folder, owned by us (or root when not `ours`), and not
    writable by others unless sticky."""
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a folder")
    if ours and st.st_uid != os.geteuid():
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not to us")
    if not _trusted_owner(st.st_uid):
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}: another user could change it")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(f"{path} is writable by other users")


def _check_chain(path: Path) -> None:
    """Every existing folder from / down to `path` is one no other user can change.

    A link on the way is followed only when root or we own it (the folder holding it was
    checked already, so nobody else can swap it)."""
    current = Path(path.anchor or "/")
    _check_folder(current, os.stat(current), ours=False)
    for part in path.parts[1:]:
        current = current / part
        st = os.lstat(current)
        if stat.S_ISLNK(st.st_mode):
            if not _trusted_owner(st.st_uid):
                raise UnsafePath(f"{current} is a link owned by uid {st.st_uid}")
            target = Path(os.path.realpath(current))
            _check_chain(target)
            current = target
            continue
        _check_folder(current, st, ours=False)


def named_folder(path: PathLike) -> Path:
    """A folder the user named for a file of theirs (e.g. `report -o`): it must exist and
    be one no other user can change (it is neither made nor changed here)."""
    path = Path(os.path.abspath(path))
    try:
        _check_chain(path)
    except FileNotFoundError:
        raise UnsafePath(f"{path}: no such folder") from None
    return path


def private_dir(path: PathLike) -> Path:
    """`path` as a folder of ours, 0700: created (with any missing parents, each 0700 and
    `mkdir`-exclusive) or, when it exists, checked with every folder above it."""
    path = Path(os.path.abspath(path))
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    _check_chain(probe)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # made meanwhile (another console of ours): checked below like any other
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        _check_chain(path)  # a link of ours (a data dir moved elsewhere): its target too
        st = os.stat(path)
    _check_folder(path, st, ours=True)
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # made by an older version with the default mode
    return path


def new_dir(path: PathLike) -> Path:
    """A fresh folder of ours, 0700, that did not exist (its parent made private first)."""
    path = Path(os.path.abspath(path))
    private_dir(path.parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise UnsafePath(f"{path} exists already: a new folder was expected") from None
    return path


def temp_dir(prefix: str, base: str | None = None) -> Path:
    """A fresh folder of ours under `base` or the system's temporary folder (`mkdtemp`:
    0700, an unpredictable name, made with `mkdir`)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def create(path: PathLike, mode: str = "wb", *, private: bool = True) -> IO[Any]:
    """A new file, opened for writing: `O_EXCL|O_NOFOLLOW`, 0600. Its folder is made
    private first unless `private=False` (a file the user named: its folder is checked,
    not changed)."""
    path = Path(os.path.abspath(path))
    (private_dir if private else named_folder)(path.parent)
    try:
        fd = os.open(path, _NEW, 0o600)
    except FileExistsError:
        raise UnsafePath(f"{path} exists already: not replaced") from None
    if mode == "w":
        return os.fdopen(fd, "w", encoding="utf-8")
    return os.fdopen(fd, "wb")


def append(path: PathLike) -> IO[str]:
    """A text file of ours opened to append (created 0600 when missing); a link, or a file
    that is not ours, is refused."""
    return os.fdopen(_append_fd(path), "a", encoding="utf-8")


def append_bytes(path: PathLike) -> IO[bytes]:
    """`append`, for bytes."""
    return os.fdopen(_append_fd(path), "ab")


def _append_fd(path: PathLike) -> int:
    path = Path(os.path.abspath(path))
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise UnsafePath(f"cannot open {path} to append: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise UnsafePath(f"{path} is not a regular file of ours")
    return fd


def replace(
    path: PathLike, data: bytes | str, *, private: bool = True, durable: bool = False
) -> Path:
    """Write `data` to `path` whole: a fresh temporary file beside it, then `os.replace`
    (readers see the old file or the new one, never a torn one; a link at `path` is
    replaced, never followed). The folder is made private first unless `private=False`
    (a file the user named, e.g. `report -o`)."""
    path = Path(os.path.abspath(path))
    (private_dir if private else named_folder)(path.parent)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, _NEW, 0o600)
        except FileExistsError:
            continue
        break
    else:
        raise UnsafePath(f"cannot create a temporary file beside {path}")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if durable:  # on disk before it replaces the old file (a saved capture)
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
