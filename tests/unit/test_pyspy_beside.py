"""py-spy beside the job's interpreter, on a node whose PATH has none: the rank's venv
(from its argv[0] and VIRTUAL_ENV) is looked in; its py-spy runs only when root (or the
agent's user) owns it and every directory above it, writable by no one else. Real
processes, a real py-spy binary, a real planted script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_node.agent.pyspy_beside import pyspy_beside, untrusted_reason
from conftest import cli_env, wait_for

from tests.support.nobody import needs_nobody, shared_tmp

REAL_PYSPY = Path(sys.base_prefix) / "bin" / "py-spy"
needs_pyspy_binary = pytest.mark.skipif(
    not REAL_PYSPY.is_file(), reason="needs py-spy installed beside this Python"
)
NO_PYSPY_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# The rank's interpreter: one with no py-spy beside it (this Python's has one), so only
# the venv's can be found.
SYSTEM_PYTHON = Path("/usr/bin/python3")
pytestmark = pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="needs /usr/bin/python3")


@pytest.fixture
def venv_root() -> Iterator[Path]:
    """A directory under /tmp (sticky, so it may hold a trusted venv) of root's."""
    with shared_tmp("areal-venv-", mode=0o755) as path:
        yield path


def make_venv(base: Path, pyspy: str | None) -> Path:
    """base/venv with bin/python (a link to the system Python) and bin/py-spy: a copy of the real
    program ("real") or a script that leaves a marker ("planted")."""
    venv = base / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(SYSTEM_PYTHON)
    assert not (SYSTEM_PYTHON.resolve().parent / "py-spy").exists()
    target = venv / "bin" / "py-spy"
    if pyspy == "real":
        shutil.copy2(REAL_PYSPY, target)
    elif pyspy == "planted":
        target.write_text(f"#!/bin/sh\ntouch {base}/MARKER\nexit 1\n")
        target.chmod(0o755)
    return venv


def rank_in(venv: Path, base: Path) -> subprocess.Popen[bytes]:
    marker = f"areal-beside-{base.name}"
    rank = subprocess.Popen(
        [str(venv / "bin" / "python"), "-c", "import time; time.sleep(600)", marker],
        env={"RANK": "0", "WORLD_SIZE": "1", "VIRTUAL_ENV": str(venv), "PATH": NO_PYSPY_PATH},
    )
    # Until it has exec'd, /proc shows the forked test process (its exe, its argv).
    wait_for(lambda: marker.encode() in Path(f"/proc/{rank.pid}/cmdline").read_bytes(),
             timeout=30, what="the rank's exec")  # fmt: skip
    return rank


def bare_python(base: Path) -> str:
    """The test's interpreter seen from a folder without py-spy: the agent also looks for
    py-spy beside its own interpreter, where pip puts it (CI's Python has one there)."""
    link = base / "bare-python" / "python"
    if not link.exists():
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(os.path.realpath(sys.executable))
    return str(link)


def capture(base: Path) -> subprocess.CompletedProcess[str]:
    argv = [bare_python(base), "-m", "areal_console", "stacks", "--local", "--source", "py-spy",
            "--match", f"areal-beside-{base.name}", "--json"]  # fmt: skip
    assert shutil.which("py-spy", path=NO_PYSPY_PATH) is None
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                          env=cli_env(PATH=NO_PYSPY_PATH))  # fmt: skip


@needs_pyspy_binary
def test_the_py_spy_of_a_root_owned_venv_is_used(venv_root: Path) -> None:
    venv = make_venv(venv_root, "real")
    rank = rank_in(venv, venv_root)
    try:
        assert pyspy_beside(rank.pid) == (str(venv / "bin" / "py-spy"), "")
        result = capture(venv_root)
    finally:
        rank.kill()
        rank.wait(timeout=30)
    assert result.returncode == 0, result.stderr
    (r,) = json.loads(result.stdout)["ranks"]
    assert (r["pid"], r["state"], r["source"]) == (rank.pid, "ok", "py-spy")
    assert any(f["function"] == "<module>" for t in r["threads"] for f in t["frames"])


@needs_nobody
def test_a_planted_py_spy_in_a_venv_of_nobody_is_not_run(venv_root: Path) -> None:
    venv = make_venv(venv_root, "planted")
    for path in [venv, *venv.rglob("*")]:
        os.lchown(path, 65534, 65534)
    rank = rank_in(venv, venv_root)
    try:
        result = capture(venv_root)
    finally:
        rank.kill()
        rank.wait(timeout=30)
    assert result.returncode == 1
    (r,) = json.loads(result.stdout)["ranks"]
    assert r["state"] == "error"
    assert r["error"] == (
        f"py-spy not found on this node: pip install py-spy; {venv}/bin/py-spy not run: "
        f"{venv}/bin/py-spy is owned by uid 65534, not root or this agent's user"
    )
    assert not (venv_root / "MARKER").exists()


def test_untrusted_reasons(venv_root: Path) -> None:
    program = venv_root / "py-spy"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert untrusted_reason(str(program)) is None
    program.chmod(0o775)
    assert untrusted_reason(str(program)) == f"{program} is writable by others (mode 775)"
    program.chmod(0o755)
    venv_root.chmod(0o777)  # world-writable and not sticky: the file could be swapped
    assert untrusted_reason(str(program)) == f"{venv_root} is writable by others (mode 777)"
    venv_root.chmod(0o755)
    link = venv_root / "link"
    link.symlink_to(program)
    assert untrusted_reason(str(link)) is None
    (venv_root / "dir").mkdir()
    assert untrusted_reason(str(venv_root / "dir")) == f"{venv_root / 'dir'} is not a regular file"
