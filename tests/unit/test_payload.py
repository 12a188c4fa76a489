"""The node payload: the same sources give the same bytes, and a plain python runs it."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from areal_console.core.connection.payload import (
    PACKAGE_DIR,
    build_payload,
    node_payload,
    package_files,
    payload_name,
)

from tests.support.interpreters import find_python


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package's sources (new files: new timestamps and inodes)."""
    copy = tmp_path / "areal_node"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.fixture
def pyz(tmp_path: Path) -> Path:
    path = tmp_path / payload_name(node_payload().sha256)
    path.write_bytes(node_payload().data)
    return path


def test_same_sources_same_bytes(tree: Path) -> None:
    (tree / "__pycache__").mkdir(exist_ok=True)
    (tree / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"not shipped")
    (tree / "py.typed").touch()
    built = build_payload(tree)
    assert built == build_payload(PACKAGE_DIR) == node_payload()
    assert node_payload() is node_payload()  # built once per process
    names = zipfile.ZipFile(io.BytesIO(built.data)).namelist()
    assert names[0] == "__main__.py"
    assert names[1:] == [name for name, _ in package_files(tree)]
    assert "areal_node/__init__.py" in names
    assert not [n for n in names if not n.endswith(".py") or "__pycache__" in n]


def test_the_hash_follows_any_module(tree: Path) -> None:
    before = build_payload(tree)
    init = tree / "__init__.py"
    init.write_bytes(init.read_bytes() + b"# one more line\n")
    changed = build_payload(tree)
    assert changed.sha256 != before.sha256
    assert changed.sha256 == hashlib.sha256(changed.data).hexdigest()
    (tree / "extra.py").write_text("X = 1\n")
    assert build_payload(tree).sha256 != changed.sha256
    assert changed.name == f"payload-{changed.sha256}.pyz"


def isolated(python: str, *args: str) -> str:
    """What `python -I ARGS` prints, run away from this checkout (no PYTHONPATH, cwd /)."""
    done = subprocess.run(
        [python, "-I", *args], capture_output=True, text=True, timeout=60, check=True, cwd="/"
    )
    return done.stdout


def test_an_isolated_python_imports_from_it(pyz: Path) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import areal_node.agent.protocol as a; "
        "print(a.PROTOCOL_VERSION, a.__file__)"
    )
    version, where = isolated(sys.executable, "-c", code, str(pyz)).split()
    assert version == "1" and where.startswith(str(pyz) + "/areal_node/")


def test_run_as_a_program_it_is_the_trainer(pyz: Path) -> None:
    assert "trajectory_debug.replay_rollout_data=false" in isolated(
        sys.executable, str(pyz), "--help"
    )


def test_the_agent_runs_from_it(pyz: Path) -> None:
    code = (
        "import sys, runpy; sys.path.insert(0, sys.argv[1]); "
        "runpy.run_module('areal_node', run_name='__main__')"
    )
    agent = subprocess.Popen(
        [sys.executable, "-I", "-c", code, str(pyz)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/",
    )  # fmt: skip
    assert agent.stdin is not None and agent.stdout is not None
    try:
        assert json.loads(agent.stdout.readline())["event"] == "ready"
        agent.stdin.write(json.dumps({"id": 1, "op": "ping", "args": {}}).encode() + b"\n")
        agent.stdin.flush()
        reply = json.loads(agent.stdout.readline())
        assert reply["id"] == 1 and reply["ok"] is True and reply["result"]["time"] > 0
    finally:
        agent.stdin.close()  # EOF ends the agent
        assert agent.wait(timeout=30) == 0


def test_python_3_9_compiles_every_module_and_runs_the_agent(pyz: Path, tmp_path: Path) -> None:
    """The node package targets Python 3.9: every module of the zip compiles there, and
    the agent started by the real bootstrap serves a sample, a log search and a job list."""
    from areal_console.core.connection.transport import BOOTSTRAP, source_frame

    found = find_python("3.9")
    if found is None:
        pytest.skip("no Python 3.9 on this machine (.ci/run installs it with uv)")
    python = found
    code = (
        "import sys, zipfile\n"
        "z = zipfile.ZipFile(sys.argv[1])\n"
        "names = [n for n in z.namelist() if n.endswith('.py')]\n"
        "for n in names: compile(z.read(n), n, 'exec')\n"
        "print(len(names), sys.version_info[:2] == (3, 9))\n"
    )
    count, is_39 = isolated(python, "-c", code, str(pyz)).split()
    assert int(count) == len(package_files()) + 1 and is_39 == "True"
    requests = [
        {"op": "sample", "args": {"all": True, "cpu": False, "gpus": False}},
        {"op": "log_find", "args": {"path": str(tmp_path)}},
        {"op": "jobs", "args": {"jobs_dir": str(tmp_path / "jobs")}},
    ]
    lines = [json.dumps({"id": i, **r}) for i, r in enumerate(requests)]
    agent = subprocess.Popen(
        [python, "-c", BOOTSTRAP, node_payload().sha256],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/", env={"HOME": str(tmp_path)},
    )  # fmt: skip
    assert agent.stdin is not None and agent.stdout is not None
    try:
        agent.stdin.write(source_frame() + "\n".join(lines).encode() + b"\n")
        agent.stdin.flush()
        got = [json.loads(agent.stdout.readline()) for _ in range(2 + len(requests))]
    finally:
        agent.stdin.close()
        agent.wait(timeout=30)
    assert [m.get("event") for m in got[:2]] == ["need_source", "ready"]
    replies = {m["id"]: m for m in got[2:]}
    assert all(replies[i]["ok"] for i in range(len(requests))), replies
    assert replies[0]["result"]["processes"] is not None
    assert replies[1]["result"]["kind"] == "dir" and replies[2]["result"] == {"jobs": []}
