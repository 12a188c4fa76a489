"""The console's one way to open a file another user may control (a file under /tmp, a
job's tracer or log file on this machine): never through a link, never blocking (a FIFO
is an error at once, not a hang), a regular file only, owned by someone the caller
trusts, and read to a bound. /tmp and other shared folders are hostile by default.

The opening itself is the node's guarded reader (areal_node/guarded_read.py:
`open_regular`), which the agent uses for the same files on a cluster node; here a
refusal is an OSError in the console's words."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from areal_node.guarded_read import OWNER, Refused, open_regular


def trusted_owners() -> frozenset[int]:
    """Root and the console's user: who may write a file the console acts on."""
    return frozenset({0, os.getuid()})


def open_guarded(path: str | Path, owners: Collection[int] | None = None) -> int:
    """A read-only fd of `path`, a regular file owned by one of `owners` (None: anyone);
    OSError otherwise (a link, a FIFO, a directory, another owner). The caller closes it."""
    try:
        return open_regular(str(path), owners).detach()
    except Refused as exc:
        if exc.reason == OWNER and exc.st is not None:
            raise OSError(
                f"{path}: owned by uid {exc.st.st_uid}, not by this user or root"
            ) from None
        raise OSError(f"{path}: not a regular file") from None


def read_guarded(path: str | Path, limit: int, owners: Collection[int] | None = None) -> bytes:
    """At most `limit` bytes from the start of `path`, opened by `open_guarded`."""
    fd = open_guarded(path, owners)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)
