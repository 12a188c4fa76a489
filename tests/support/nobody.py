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
# A Python `nobody` can run: the system's (ours may live in root's home, which nobody cannot
# enter; a `python3` on PATH may be such a one, e.g. a pyenv shim).
NOBODY_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"


def as_nobody(*argv: str) -> None:
    subprocess.run([*NOBODY, *argv], check=True)


@contextmanager
def shared_tmp(prefix: str = "areal-trust-", mode: int = 0o1777) -> Iterator[Path]:
    """A fresh folder under /tmp, removed afterwards. By default anyone may write in it,
    as in /tmp (sticky), and `nobody` plants there; `mode=0o755`: root's, which `nobody`
    reaches but cannot change (a root venv, AReaL's default record root)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(d, mode)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# Modules an attacker leaves where an interpreter of ours may start (its working
# directory): each records that it ran.
PLANTED_MODULES = ("hashlib.py", "sitecustomize.py", "torch/__init__.py")


def plant_modules(folder: Path, markers: Path) -> None:
    """As `nobody`, in `folder`: `PLANTED_MODULES`, each writing a file into `markers`
    (a folder root can write) when imported."""
    for name in PLANTED_MODULES:
        tag = name.replace("/", "-")
        code = (
            "import os, sys\n"
            f"open(os.path.join({str(markers)!r}, {tag!r} + '-%d' % os.getpid()), 'w')"
            ".write(repr((os.getuid(), os.getcwd(), sys.argv[:2], sys.path[:2])))\n"
        )
        if "/" in name:
            as_nobody("mkdir", "-p", str(folder / os.path.dirname(name)))
        as_nobody("sh", "-c", 'printf %s "$1" > "$2"', "sh", code, str(folder / name))


def planted_ran(markers: Path) -> list[str]:
    """The planted modules that ran: each with the pid, uid, working directory, argv and
    first sys.path entries of the interpreter that ran it."""
    return sorted(f"{p.name} {p.read_text()[:300]}" for p in markers.iterdir())
