"""What a node runs: the `areal_node` package as one zip, named by its content hash.

The agent bootstrap, the batch reader, the reference trainer and its launch hook all reach
a node as this one file. It is built here and nowhere else: every `.py` file of the
package under `areal_node/` (sorted, fixed timestamps and modes, no bytecode), plus a
root `__main__.py`: run as a program (`python3 payload.pyz ARGS`), the payload is the
reference trainer (`python3 -m areal_node.trainer ARGS`, what replay templates run as
`{script}`); the agent bootstrap imports the agent from it instead. The
same source tree always gives the same bytes, hence the same hash, so a node that has the
file in its cache (`payload_name(sha256)`) reuses it across consoles and sessions. The
entries are stored, not compressed: building it costs a console start about a millisecond
(deflating, ten), the bytes do not depend on the zlib at hand, and a node reads them as
they are.

On a node: `sys.path.insert(0, path_to_cached_pyz)`, then import from `areal_node`
(zipimport; Python 3.9+ reads it).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import areal_node

PACKAGE = "areal_node"
# The package's source tree (this machine's copy of what nodes run).
PACKAGE_DIR = Path(areal_node.__file__).resolve().parent
# Every entry's timestamp (the earliest a zip can hold) and mode, so the bytes depend on
# the sources alone.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_MODE = 0o644 << 16
ROOT_MAIN = (
    b'"""`python3 payload.pyz ARGS` is `python3 -m areal_node.trainer ARGS`."""\n'
    b"import runpy\n\n"
    b'runpy.run_module("areal_node.trainer", run_name="__main__", alter_sys=True)\n'
)


@dataclass(frozen=True)
class Payload:
    """The zip a node runs and the SHA-256 (hex) of its bytes."""

    data: bytes
    sha256: str

    @property
    def name(self) -> str:
        """Its file name in a node's cache."""
        return payload_name(self.sha256)


def payload_name(sha256: str) -> str:
    """The cached payload's file name on a node."""
    return f"payload-{sha256}.pyz"


def package_files(root: Path = PACKAGE_DIR) -> list[tuple[str, str]]:
    """(name in the zip, file here) of every module of the package, sorted by name."""
    found = []
    top = str(root)
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        rel = os.path.relpath(dirpath, top).replace(os.sep, "/")
        prefix = PACKAGE + "/" if rel == "." else f"{PACKAGE}/{rel}/"
        for name in filenames:
            if name.endswith(".py") and not name.startswith("."):
                found.append((prefix + name, os.path.join(dirpath, name)))
    return sorted(found)


def build_payload(root: Path = PACKAGE_DIR) -> Payload:
    """The payload of the package at `root`: same sources, same bytes."""
    # Imported here: a console that starts no agent elsewhere (a local capture) never
    # builds the payload and need not load them.
    import hashlib
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        entries = [("__main__.py", ROOT_MAIN)]
        for arcname, path in package_files(root):
            with open(path, "rb") as f:
                entries.append((arcname, f.read()))
        for arcname, content in entries:
            info = zipfile.ZipInfo(arcname, date_time=_EPOCH)
            info.external_attr = _MODE
            info.create_system = 3  # Unix, whatever builds it
            archive.writestr(info, content)
    data = buffer.getvalue()
    return Payload(data=data, sha256=hashlib.sha256(data).hexdigest())


_lock = threading.Lock()
_cached: Payload | None = None


def node_payload() -> Payload:
    """The payload of the installed package, built once per process."""
    global _cached
    with _lock:
        if _cached is None:
            _cached = build_payload()
        return _cached
