"""Node job ops through a real local agent: launch, events, tail, stop, reconnect, node loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.connection.fleet import Fleet, NodeSession
from areal_console.core.replay import runs as jobs
from areal_console.core.targets.resolve import NodeSpec, local_node

from tests.support.waits import wait_for

# A job that logs a line, then waits to be stopped (or finishes after 60 s).
SLOW_JOB = "import sys,time\nprint('started', flush=True)\nfor i in range(600):\n time.sleep(0.1)\n"


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


@pytest.fixture()
def session(env: Path) -> Iterator[tuple[NodeSession, list[dict[str, Any]]]]:
    events: list[dict[str, Any]] = []
    fleet = Fleet([local_node()], on_event=lambda s, e: events.append(e))
    s = fleet.sessions[0]
    s.connect()
    yield s, events
    for job in s.call("jobs")["jobs"]:  # never leave a job behind
        if job["state"] == "running":
            s.call("job_stop", {"job": job["job"], "grace": 2}, timeout=20)
    fleet.close()


def test_job_runs_detached_logs_and_reports_exit(session: tuple[NodeSession, list]) -> None:
    s, events = session
    job = s.call(
        "job_launch",
        {
            "job": "j1",
            "argv": [
                sys.executable,
                "-c",
                "import os,sys;print('hi', os.environ['X']);sys.exit(3)",
            ],
            "env": {"X": "from-env"},
        },
    )
    assert job["state"] in ("running", "failed") and job["pid"] > 0
    wait_for(lambda: any(e.get("event") == "job_exit" and e["job"] == "j1" for e in events))
    exit_event = next(e for e in events if e.get("event") == "job_exit")
    assert exit_event["state"] == "failed" and exit_event["exit_code"] == 3
    tail = s.call("job_tail", {"job": "j1", "lines": 5})
    assert tail["lines"] == ["hi from-env"] and tail["exit_code"] == 3
    listed = s.call("jobs")["jobs"]
    assert [j["job"] for j in listed] == ["j1"]


def test_stop_and_reconnect_find_the_record(session: tuple[NodeSession, list], env: Path) -> None:
    s, _ = session
    job = s.call("job_launch", {"job": "slow", "argv": [sys.executable, "-c", SLOW_JOB]})
    wait_for(lambda: s.call("job_tail", {"job": "slow"})["lines"] == ["started"])
    assert os.getsid(job["pid"]) == job["pid"]  # its own session: outlives agent and console
    # A fresh agent (as after a reconnect) sees the running job from its record on disk.
    other = Fleet([local_node()])
    try:
        seen = other.sessions[0].call("jobs", {"jobs": ["slow"]})["jobs"]
        assert seen[0]["state"] == "running" and seen[0]["pid"] == job["pid"]
        stopped = other.sessions[0].call("job_stop", {"job": "slow", "grace": 5}, timeout=20)
    finally:
        other.close()
    assert stopped["state"] == "stopped" and stopped["exit_code"] == -15
    child = stopped["child_pid"]
    wait_for(
        lambda: (
            not Path(f"/proc/{child}").exists()
            or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
        )
    )


def test_unknown_job_and_bad_arguments(session: tuple[NodeSession, list]) -> None:
    s, _ = session
    from areal_console.core.connection.client import AgentError

    with pytest.raises(AgentError, match="no job nope"):
        s.call("job_tail", {"job": "nope"})
    with pytest.raises(AgentError, match="bad job id"):
        s.call("job_launch", {"job": "../x", "argv": ["true"]})
    with pytest.raises(AgentError, match="non-empty list of strings"):
        s.call("job_launch", {"argv": "rm -rf /"})


def test_trainer_is_staged_once_by_content_hash(session: tuple[NodeSession, list]) -> None:
    """The node runs the trainer from the payload, staged under the trainer's name."""
    from areal_console.core.connection.payload import node_payload

    s, _ = session
    path = jobs.stage_trainer(s)
    payload = node_payload()
    assert Path(path).name == "reference_trainer.pyz"
    assert Path(path).read_bytes() == payload.data
    again = s.call("stage_file", {"name": "reference_trainer.pyz", "sha256": payload.sha256})
    assert again == {"path": path, "present": True}
    # Run as a program, the staged payload is the trainer (what replay templates run).
    out = subprocess.run(
        [sys.executable, path, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert out.returncode == 0, out.stderr
    assert "trajectory_debug.replay_rollout_data=false" in out.stdout


def test_dropped_node_shows_unknown_and_keeps_the_log(env: Path) -> None:
    record = jobs.RunRecord(
        job_id="replay-x",
        node="gone",
        plan={"steps": [1, 2]},
        launched_at=time.time(),
        log="/scratch/replay-x/train.log",
    )
    jobs.save_run(record)
    unreachable = NodeSession(NodeSpec(name="gone", transport="nowhere"))
    jobs.refresh(unreachable, record)
    assert record.state == "unknown" and "unreachable" in (record.error or "")
    saved = jobs.load_runs()
    assert [(r.job_id, r.state, r.log) for r in saved] == [
        ("replay-x", "unknown", "/scratch/replay-x/train.log")
    ]
    assert json.loads((env / "data" / "jobs" / "replay-x.json").read_text())["state"] == "unknown"
