"""Every folder and file the console creates goes through here (see
`areal_node.private_files`, the one implementation, which the node agent uses too).

We write only under a folder no other user can change (the data dir, the cache dir, a
fresh temporary folder, or a folder the user named that passes the same check); folders
are made 0700 with `mkdir`, files `O_CREAT|O_EXCL|O_NOFOLLOW`, a whole file is replaced
through a fresh temporary file beside it. Here a refusal is a `UserError` (one line at
the command line). `tests/unit/test_write_contract.py` holds every console module to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Literal, overload

from areal_node import private_files as impl

from areal_console.core.common.errors import UserError


class UnsafePath(UserError):
    """A folder or file we were asked to write in, which another user could change."""


@contextmanager
def _refused() -> Iterator[None]:
    try:
        yield
    except impl.UnsafePath as exc:
        raise UnsafePath(str(exc)) from None


def private_dir(path: str | Path) -> Path:
    """`path` as a folder of ours, 0700: made (with any missing parents, each 0700) or, when
    it exists, checked with every folder above it."""
    with _refused():
        return impl.private_dir(path)


def new_dir(path: str | Path) -> Path:
    """A fresh folder of ours, 0700, that did not exist (its parent made private first)."""
    with _refused():
        return impl.new_dir(path)


def named_folder(path: str | Path) -> Path:
    """A folder the user named (e.g. for `report -o`): it must exist and be one no other
    user can change; it is neither made nor changed."""
    with _refused():
        return impl.named_folder(path)


def temp_dir(prefix: str) -> Path:
    """A fresh 0700 folder with an unpredictable name under the system's temporary folder."""
    return impl.temp_dir(prefix)


@overload
def create(path: str | Path, mode: Literal["wb"] = ..., *, private: bool = ...) -> IO[bytes]: ...
@overload
def create(path: str | Path, mode: Literal["w"], *, private: bool = ...) -> IO[str]: ...
def create(path: str | Path, mode: str = "wb", *, private: bool = True) -> IO[bytes] | IO[str]:
    """A new file opened for writing (0600, never an existing file, never through a link);
    its folder made private first, or checked when `private=False` (a file the user named)."""
    with _refused():
        return impl.create(path, mode, private=private)


def append(path: str | Path) -> IO[str]:
    """A text file of ours opened to append (made 0600 when missing; a link or another
    user's file is refused)."""
    with _refused():
        return impl.append(path)


def append_bytes(path: str | Path) -> IO[bytes]:
    """`append`, for bytes."""
    with _refused():
        return impl.append_bytes(path)


def replace(
    path: str | Path, data: bytes | str, *, private: bool = True, durable: bool = False
) -> Path:
    """`path` written whole through a fresh temporary file beside it and `os.replace`;
    `durable` syncs it to disk first."""
    with _refused():
        return impl.replace(path, data, private=private, durable=durable)
