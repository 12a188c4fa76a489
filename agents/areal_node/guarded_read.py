"""The node's one way to open a file another user may control: a job's log, a Flight
Recorder dump, an nfs name-resolve record, a package's metadata in a rank's interpreter.

`open_regular` opens without blocking (`O_NONBLOCK`: a FIFO planted in place of a file is
refused at once, never a hang) and without following a final link (`O_NOFOLLOW`), then
checks the open descriptor (`fstat`, so a file swapped after a look is the file checked):
a regular file only, owned by one of the users the caller trusts, no larger than its bound.
With `links_of`, the links on the way are resolved here first and followed only when
root, the agent's user or one of those users owns them (a link another user planted is
not followed). What the file holds is read to a bound (`RegularFile.read`).

A refusal is `Refused`, whose `reason` says which check failed and whose `st` is the open
file's status (where it was opened), so each caller words it as its answers always have;
an open that fails is the `OSError` of `os.open` itself (`ELOOP` for a final link).

Every reader of the node package opens another user's file through this module:
`tests/unit/test_node_read_contract.py` fails on any other `open` call in the package
that its allow-list does not name with a reason. Standard library only; Python 3.9 reads it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from typing import Any

from areal_node.agent.procfs import read_fd

MAX_SYMLINK_HOPS = 40
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

# Why a file was refused (`Refused.reason`).
LINK = "link"  # a link on the way that an untrusted user owns, or too many links
NOT_REGULAR = "not_regular"  # a FIFO, socket, device or folder
OWNER = "owner"  # owned by a user the caller does not trust
TOO_LARGE = "too_large"  # larger than the caller's bound


class Refused(Exception):
    """A file the caller must not read. `reason`: LINK, NOT_REGULAR, OWNER or TOO_LARGE;
    `st`: the open file's status (None for LINK); `size`: the bytes it held past its bound
    (TOO_LARGE), else its size."""

    def __init__(self, reason: str, message: str, st: os.stat_result | None = None,
                 size: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.reason = reason
        self.st = st
        self.size = size if size is not None else (st.st_size if st is not None else 0)


def user_name(uid: int) -> str:
    """A user's name, or `uid N` where the node has no such user."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def resolve_links(path: str, links_of: Collection[int]) -> str:
    """`path` with its links resolved, each one followed only when root, the agent's user
    or one of `links_of` owns it; `Refused` (LINK) for any other link on the way."""
    trusted = {0, os.getuid(), *links_of}
    parts = os.path.abspath(path).split("/")
    parts.reverse()
    cur = "/"
    hops = 0
    while parts:
        name = parts.pop()
        if name in ("", "."):
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return os.path.join(nxt, *reversed(parts))
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in trusted:
                raise Refused(
                    LINK, f"{nxt} is a symlink owned by {user_name(st.st_uid)}: not followed"
                )
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                raise Refused(LINK, f"{path}: too many levels of symbolic links")
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            parts.extend(reversed(target.split("/")))
            continue
        cur = nxt
    return cur


class RegularFile:
    """An open regular file that passed `open_regular`'s checks: `fd`, `st` (its status
    when checked), `path` (as opened: links resolved where asked). Closes on `with`."""

    def __init__(self, fd: int, st: os.stat_result, path: str, max_bytes: int | None) -> None:
        self.fd = fd
        self.st = st
        self.path = path
        self.max_bytes = max_bytes

    def read(self, limit: int | None = None) -> bytes:
        """At most `limit` bytes from the current offset. Without `limit`, all of it up to
        the `max_bytes` it was opened with; a file that grew past that since it was
        checked is `Refused` (TOO_LARGE)."""
        if limit is not None:
            return read_fd(self.fd, limit)
        if self.max_bytes is None:
            raise ValueError("read() needs a limit where the file was opened without max_bytes")
        data = read_fd(self.fd, self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise Refused(TOO_LARGE, f"{self.path}: more than {self.max_bytes} bytes", self.st,
                          len(data))  # fmt: skip
        return data

    def detach(self) -> int:
        """The descriptor, now the caller's to close."""
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RegularFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_regular(
    path: str,
    owners: Collection[int] | None = None,
    max_bytes: int | None = None,
    links_of: Collection[int] | None = None,
) -> RegularFile:
    """`path` opened for reading without blocking and without following a final link,
    then checked on the descriptor: a regular file (NOT_REGULAR), owned by one of `owners`
    (None: by anyone; empty: by no one) (OWNER), of at most `max_bytes` (TOO_LARGE).
    `links_of`: resolve the links on the way first, following only those root, the agent's
    user or these users own (LINK); without it the kernel resolves the folders above.
    `OSError` where the open itself fails; `Refused` for the rest (the descriptor closed)."""
    real = resolve_links(path, links_of) if links_of is not None else path
    fd = os.open(real, _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(NOT_REGULAR, f"{path} is not a regular file", st)
        if owners is not None and st.st_uid not in owners:
            raise Refused(OWNER, f"{path} is owned by {user_name(st.st_uid)}: not trusted", st)
        if max_bytes is not None and st.st_size > max_bytes:
            raise Refused(TOO_LARGE, f"{path}: {st.st_size} bytes, more than {max_bytes}", st)
    except BaseException:
        os.close(fd)
        raise
    return RegularFile(fd, st, real, max_bytes)
