"""Acting as another local user: the real user `nobody`, through `setpriv` (the tests
that plant hostile files, processes and servers run as root, as a node's agent does)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SETPRIV = shutil.which("setpriv")
needs_nobody = pytest.mark.skipif(
    os.getuid() != 0 or SETPRIV is None, reason="planting files as nobody needs root and setpriv"
)
NOBODY = [SETPRIV or "setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]


def as_nobody(*argv: str) -> None:
    subprocess.run([*NOBODY, *argv], check=True)


@contextmanager
def shared_tmp() -> Iterator[Path]:
    """A directory anyone may write, as /tmp is (sticky), where `nobody` can reach it."""
    d = Path(tempfile.mkdtemp(prefix="areal-trust-", dir="/tmp"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
