"""The console's one way to open a file another user may control (a file under /tmp, a
job's tracer or log file on this machine): never through a link, never blocking (a FIFO
is an error at once, not a hang), a regular file only, owned by someone the caller
trusts, and read to a bound. /tmp and other shared folders are hostile by default.
The node side has its own (areal_node/guarded_read.py: `open_regular`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path


def trusted_owners() -> frozenset[int]:
    """Root and the console's user: who may write a file the console acts on."""
    return frozenset({0, os.getuid()})


def open_guarded(path: str | Path, owners: Collection[int] | None = None) -> int:
    """A read-only fd of `path`, a regular file owned by one of `owners` (None: anyone);
    OSError otherwise (a link, a FIFO, a directory, another owner). The caller closes it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        if owners is not None and st.st_uid not in owners:
            raise OSError(f"{path}: owned by uid {st.st_uid}, not by this user or root")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_guarded(path: str | Path, limit: int, owners: Collection[int] | None = None) -> bytes:
    """At most `limit` bytes from the start of `path`, opened by `open_guarded`."""
    fd = open_guarded(path, owners)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)
