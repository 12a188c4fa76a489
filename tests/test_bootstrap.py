"""The one agent bootstrap, in both of its ways of receiving the source, run for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from areal_console.core.slurm_channel import shared_source_line
from areal_console.core.transport import BOOTSTRAP, SHARED_BOOTSTRAP
from areal_node import agent_hash, agent_source


def run(script: str, home: Path, stdin: bytes) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", script, agent_hash()],
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
    source = agent_source()
    payload = shared_source_line() if shared else str(len(source)).encode() + b"\n" + source
    first = run(script, tmp_path, payload)
    assert first[0] == {"event": "need_source"}
    assert first[1]["event"] == "ready"
    cached = tmp_path / ".cache" / "areal-console" / f"agent-{agent_hash()}.py"
    assert cached.read_bytes() == source
    again = run(script, tmp_path, b"")  # cache hit: no question, straight to the agent
    assert [m["event"] for m in again] == ["ready"]
