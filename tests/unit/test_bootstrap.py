"""The one agent bootstrap, in both of its ways of receiving the source, run for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from areal_console.core.connection.payload import node_payload
from areal_console.core.connection.transport import BOOTSTRAP, SHARED_BOOTSTRAP
from areal_console.core.slurm.channel import shared_source_line


def run(script: str, home: Path, stdin: bytes) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", script, node_payload().sha256],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("shared", [False, True], ids=["length-prefixed", "json-line"])
def test_bootstrap_asks_once_then_runs_the_cached_agent(tmp_path: Path, shared: bool) -> None:
    script = SHARED_BOOTSTRAP if shared else BOOTSTRAP
    data = node_payload().data
    sent = shared_source_line() if shared else str(len(data)).encode() + b"\n" + data
    first = run(script, tmp_path, sent)
    assert first[0] == {"event": "need_source"}
    assert first[1]["event"] == "ready"
    cached = tmp_path / ".cache" / "areal-console" / node_payload().name
    assert cached.read_bytes() == data
    again = run(script, tmp_path, b"")  # cache hit: no question, straight to the agent
    assert [m["event"] for m in again] == ["ready"]


def test_the_agent_runs_from_the_payload_alone(tmp_path: Path) -> None:
    """No site-packages, no PYTHONPATH: everything the agent imports comes from the zip."""
    data = node_payload().data
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", BOOTSTRAP, node_payload().sha256],
        input=str(len(data)).encode() + b"\n" + data + b'{"id":1,"op":"hello","args":{}}\n',
        capture_output=True, timeout=60, env={"HOME": str(tmp_path)}, check=True, cwd="/",
    )  # fmt: skip
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r.get("event") for r in replies[:2]] == ["need_source", "ready"]
