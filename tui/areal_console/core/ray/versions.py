"""When the console's Ray can't talk to the cluster's: one line naming both versions.

Ray checks a driver against the cluster as it attaches (`ray.init` ->
`Node.check_version_info` -> `ray._private.utils.check_version_info`, Ray 2.60): the
cluster's Ray and Python versions, which the head stored in the GCS, must equal the
driver's (Python to the patch level unless `RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL=minor`),
else it raises `RuntimeError("Version mismatch: The cluster was started with:\\n    Ray:
X\\n    Python: Y\\nThis process on node IP was started with:\\n    Ray: A\\n    Python:
B\\n")`. Ray Client checks the same pair against its server (`ray.util.client`). A Ray far
enough apart may fail before that check, in its RPCs; then the dashboard's `/api/version`
(`ray_version`) tells the cluster's version without Ray.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from dataclasses import dataclass

VERSION_TIMEOUT = 3.0

_MISMATCH = re.compile(
    r"version mismatch.*?cluster was started with:\s*Ray:\s*(?P<ray>\S+)\s*Python:\s*(?P<py>\S+)"
    r".*?was started with:\s*Ray:\s*(?P<my_ray>\S+)\s*Python:\s*(?P<my_py>\S+)",
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True)
class RayVersions:
    """The cluster's Ray and Python versions against the console's (Python unknown: None)."""

    cluster_ray: str
    cluster_python: str | None
    console_ray: str
    console_python: str


def from_ray_error(text: str) -> RayVersions | None:
    """The versions in Ray's own mismatch error, or None when `text` is no such error."""
    m = _MISMATCH.search(text)
    if m is None:
        return None
    return RayVersions(m["ray"], m["py"], m["my_ray"], m["my_py"])


def mismatch_line(address: str, v: RayVersions) -> str:
    """One line: both versions, and what to install or run."""
    theirs = f"Ray {v.cluster_ray}" + (f" (Python {v.cluster_python})" if v.cluster_python else "")
    ours = f"Ray {v.console_ray} (Python {v.console_python})"
    todo = []
    if v.cluster_ray != v.console_ray:
        todo.append(f"install the cluster's Ray next to the console: pip install 'ray[default]=="
                    f"{v.cluster_ray}'")  # fmt: skip
    if v.cluster_python and v.cluster_python != v.console_python:
        same_minor = v.cluster_python.split(".")[:2] == v.console_python.split(".")[:2]
        todo.append(
            f"run the console with Python {v.cluster_python}"
            + (" (or set RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL=minor)" if same_minor else "")
        )
    return (
        f"--ray: this console's {ours} can't talk to the cluster at {address}, which runs "
        f"{theirs}: {'; '.join(todo) or 'use the versions the cluster runs'}"
    )


def dashboard_ray_version(
    dashboard: str, token: str | None, timeout: float = VERSION_TIMEOUT
) -> str | None:
    """The cluster's Ray version from its dashboard's `/api/version`, or None when the
    dashboard does not answer it (best effort: only to explain a failure)."""
    request = urllib.request.Request(f"{dashboard}/api/version")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            doc = json.loads(reply.read(64 * 1024))
    except (OSError, ValueError):
        return None
    version = doc.get("ray_version") if isinstance(doc, dict) else None
    return version if isinstance(version, str) and 0 < len(version) <= 64 else None


def console_python() -> str:
    return ".".join(map(str, sys.version_info[:3]))
