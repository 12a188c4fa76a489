"""`areal-console metrics` and the agent's `file_tail` / `log_find` ops, on real processes."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from areal_console.core.connection.client import AgentClient, AgentError
from areal_console.core.connection.transport import LocalChannel
from areal_console.core.metrics.follow import MetricsFollower, NodeFiles
from areal_console.core.metrics.health import BEHAVE_IMP_WEIGHT

from tests.conftest import run_cli, wait_for
from tests.support.areal_logfmt import AReaLLogWriter, actor_stats, write_run


class Session:
    """The part of a node session the metrics follower uses, over a real local agent."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self.name = "node0"

    def call(self, op, args=None, timeout=30.0):  # type: ignore[no-untyped-def]
        return self.client.request(op, args, timeout=timeout)


@pytest.fixture(scope="module")
def agent():  # type: ignore[no-untyped-def]
    client = AgentClient(LocalChannel())
    client.start()
    yield client
    client.close()


def test_agent_file_tail_follows_offsets_rotation_and_truncation(agent, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "trainer.log"
    log.write_bytes(b"one\ntwo\n")
    first = agent.request("file_tail", {"path": str(log), "offset": 0, "max_bytes": 4})
    assert first["next"] == 4 and not first["eof"] and first["size"] == 8
    rest = agent.request("file_tail", {"path": str(log), "offset": 4, "ident": first["ident"]})
    assert rest["next"] == 8 and rest["eof"] and not rest["rotated"]
    log.write_bytes(b"x\n")  # truncated in place
    again = agent.request("file_tail", {"path": str(log), "offset": 8, "ident": first["ident"]})
    assert again["truncated"] and again["offset"] == 0 and again["next"] == 2
    os.rename(log, tmp_path / "old.log")
    log.write_bytes(b"new file\n")
    moved = agent.request("file_tail", {"path": str(log), "offset": 2, "ident": again["ident"]})
    assert moved["rotated"] and moved["offset"] == 0 and moved["next"] == 9
    with pytest.raises(AgentError, match="no such file on this node"):
        agent.request("file_tail", {"path": str(tmp_path / "nope")})
    with pytest.raises(AgentError, match="is a directory"):
        agent.request("file_tail", {"path": str(tmp_path)})
    with pytest.raises(AgentError, match="'offset' must be int"):
        agent.request("file_tail", {"path": str(log), "offset": "x"})


def test_agent_log_find_lists_areal_logs_and_event_files(agent, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_run(tmp_path, 2, tensorboard=tmp_path / "tb")
    (tmp_path / "actor.log").write_text("worker\n")
    found = agent.request("log_find", {"path": str(tmp_path)})
    assert [Path(p).name for p in found["logs"]] == ["main.log", "merged.log", "actor.log"]
    assert len(found["events"]) == 1 and "/tb/events.out.tfevents." in found["events"][0]
    with pytest.raises(AgentError, match="no such file or directory"):
        agent.request("log_find", {"path": str(tmp_path / "nope")})


def test_follower_through_the_agent_reads_logs_and_mirrors_tensorboard(
    agent, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    writer = AReaLLogWriter(tmp_path / "run", tensorboard=tmp_path / "tb")
    for s in range(3):
        writer.commit(0, s, s, actor_stats(s))
    follower = MetricsFollower(str(tmp_path / "run"), NodeFiles(Session(agent)))
    assert follower.poll() == 3
    assert follower.source == f"node0:{tmp_path / 'run' / 'main.log'}"
    writer.commit(0, 3, 3, actor_stats(3, **{BEHAVE_IMP_WEIGHT: 1.5}))
    assert follower.poll() == 1
    assert follower.store.latest(BEHAVE_IMP_WEIGHT) == 1.5
    writer.close()
    follower.poll()
    assert follower.finished

    tb = MetricsFollower(str(tmp_path / "tb"), NodeFiles(Session(agent)))
    tb.poll()
    assert tb.store.series(BEHAVE_IMP_WEIGHT)[0] == [0, 1, 2, 3]
    assert tb.store.latest(BEHAVE_IMP_WEIGHT) == 1.5
    tb.close()


def test_cli_text_and_json(tmp_path: Path) -> None:
    write_run(tmp_path, 30, stats=lambda s: actor_stats(s, **{BEHAVE_IMP_WEIGHT: 1.0 + 0.01 * s}))
    text = run_cli("metrics", str(tmp_path))
    assert text.returncode == 0, text.stderr
    assert "ppo_actor/update/behave_imp_weight/avg" in text.stdout
    assert "rollout.max_head_offpolicyness" in text.stdout
    assert "stalled" in text.stdout  # written in 2023, nothing since

    out = run_cli("metrics", str(tmp_path / "main.log"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert set(report) == {"source", "steps", "series", "latest", "warnings", "last_step_at",
                           "stalled", "unread_bytes", "notes", "stragglers"}  # fmt: skip
    assert report["steps"] == list(range(30))
    assert report["latest"][BEHAVE_IMP_WEIGHT] == pytest.approx(1.29)
    assert report["stragglers"] == []  # no perf tracer files
    assert {w["metric"] for w in report["warnings"]} == {BEHAVE_IMP_WEIGHT, "progress"}
    assert report["stalled"] is True


def test_cli_bad_input_is_one_line_and_an_exit_code(tmp_path: Path) -> None:
    missing = run_cli("metrics", str(tmp_path / "nope"))
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert "no such file or directory" in missing.stderr
    usage = run_cli("metrics")
    assert usage.returncode == 2 and "give a log PATH" in usage.stderr
    bad = run_cli("metrics", "--local", "--job", "(")
    assert bad.returncode == 2 and "bad --job regex" in bad.stderr
    settings = tmp_path / "config.yaml"
    settings.write_text("health:\n  stall_facter: 3\n")
    typo = run_cli("metrics", str(tmp_path), AREAL_CONSOLE_CONFIG=str(settings))
    assert typo.returncode == 1 and "unknown health threshold 'stall_facter'" in typo.stderr


def test_cli_finds_the_log_dir_from_a_jobs_command_line(tmp_path: Path) -> None:
    """A process with single-controller workers' flags; the log dir is derived, then read
    through the agent."""
    tag = f"healthjob{os.getpid()}"
    log_dir = tmp_path / "logs" / getpass.getuser() / tag / "trial0"
    write_run(log_dir, 5, finished=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                             "--experiment-name", tag, "--trial-name", "trial0",
                             "--fileroot", str(tmp_path)])  # fmt: skip
    try:
        wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().count(b"\0") > 5,
                 what="the job process")  # fmt: skip
        out = run_cli("metrics", "--local", "--job", tag, "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["source"].endswith(f"{log_dir}/main.log")
        assert report["steps"] == [0, 1, 2, 3, 4] and report["stalled"] is False
        none = run_cli("metrics", "--local", "--job", tag + "-nothing")
        assert none.returncode == 1 and "names an AReaL log directory" in none.stderr
    finally:
        proc.kill()
        proc.wait()


def test_cli_follow_prints_steps_until_the_run_completes(tmp_path: Path) -> None:
    writer = AReaLLogWriter(tmp_path, mode="spmd")
    writer.commit(0, 0, 0, actor_stats(0))
    cmd = [sys.executable, "-m", "areal_console", "metrics", str(tmp_path), "--follow",
           "--json", "--interval", "0.1"]  # fmt: skip
    from tests.conftest import cli_env

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["steps"] == [0]
        writer.commit(0, 1, 1, actor_stats(1))
        second = json.loads(proc.stdout.readline())
        assert second["steps"] == [0, 1]
        writer.close()
        assert proc.wait(timeout=30) == 0  # the completion line ends --follow
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_tui_takes_a_health_path() -> None:
    from areal_console.cli import build_parser

    args = build_parser().parse_args(["tui", "--health", "/runs/x", "--health-node", "n1"])
    assert (args.health, args.health_node) == ("/runs/x", "n1")


@pytest.mark.slow
def test_cli_finds_a_single_controller_runs_log_from_its_real_workers(tmp_path: Path) -> None:
    """Workers started as AReaL's LocalScheduler starts them (bash -c ... stdbuf ... rpc_server
    --experiment-name E --trial-name T --fileroot F | tee); the controller's log where
    AReaL's StatsLogger puts it."""
    from tests.tui.test_areal_processes import ArealRun

    run = ArealRun(tmp_path / "run", "collective", 2)
    try:
        log_dir = tmp_path / "run" / "logs" / getpass.getuser() / "gsm8k-grpo" / run.trial
        write_run(log_dir, 6, finished=True)
        out = run_cli("metrics", "--local", "--job", run.trial, "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["source"].endswith(f"{log_dir}/main.log")
        assert report["steps"] == list(range(6)) and report["stalled"] is False
    finally:
        run.stop()
