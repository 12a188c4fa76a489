"""Older Python interpreters for the tests that run the node agent on them.

`.ci/run` installs 3.8 and 3.9 with uv (`uv python install`: its downloads start at 3.8);
a developer machine may have them from pyenv or on PATH. Older ones (3.6, 3.7) are not
required: what the bootstrap needs of them is checked by vermin (tests/unit/test_node_python.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def _uv_python_dir() -> Path:
    explicit = os.environ.get("UV_PYTHON_INSTALL_DIR")
    if explicit:
        return Path(explicit)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "uv" / "python"


def _runs(python: str, version: str) -> bool:
    """A real interpreter of `version` (pyenv's shims on PATH are scripts that may fail)."""
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def find_python(version: str) -> str | None:
    """A `pythonX.Y` executable of `version` ("3.8"): pyenv's, uv's, else one on PATH."""
    pyenv = Path(os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))) / "versions"
    candidates = [
        *sorted(pyenv.glob(f"{version}.*/bin/python{version}")),
        *sorted(_uv_python_dir().glob(f"cpython-{version}.*/bin/python{version}")),
    ]
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in reversed(candidates):  # the newest patch release first
        if _runs(str(candidate), version):
            return str(candidate)
    return None
