"""A job's log from where its output goes: the agent reports each process's stdout file
(/proc/PID/fd/1, a regular file its own user owns), and `job_log` takes it where the
command lines name no AReaL log directory (`train.py > run.log`, the demo's trainer.log)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from areal_console.core.connection.client import AgentClient
from areal_console.core.connection.records import ProcessRow, process_rows
from areal_console.core.connection.transport import InProcessChannel
from areal_console.core.metrics.locate import job_log
from areal_node.agent.procfs import stdout_path

from tests.support.nobody import as_nobody, needs_nobody, shared_tmp

SLEEPER = [sys.executable, "-c", "import sys, time; sys.stdin.read()"]


@contextmanager
def running(stdout: object, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A process that waits on its stdin (closed to end it), its output going to `stdout`."""
    proc = subprocess.Popen(SLEEPER, stdin=subprocess.PIPE, stdout=stdout,  # type: ignore[arg-type]
                            env={**os.environ, **(env or {})})  # fmt: skip
    try:
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_process_writing_to_its_users_file_names_it(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    with open(log, "wb") as out, running(out) as proc:
        assert stdout_path(f"/proc/{proc.pid}", os.getuid()) == str(log)
        # Only the process's own user's file: the uid given is not the file's owner.
        assert stdout_path(f"/proc/{proc.pid}", os.getuid() + 1) is None


def test_pipes_terminals_devices_and_deleted_files_are_no_log(tmp_path: Path) -> None:
    with running(subprocess.PIPE) as piped:
        assert stdout_path(f"/proc/{piped.pid}", os.getuid()) is None
    with running(subprocess.DEVNULL) as devnull:
        assert stdout_path(f"/proc/{devnull.pid}", os.getuid()) is None
    log = tmp_path / "gone.log"
    with open(log, "wb") as out, running(out) as proc:
        log.unlink()
        assert stdout_path(f"/proc/{proc.pid}", os.getuid()) is None
    assert stdout_path("/proc/999999999", os.getuid()) is None


@needs_nobody
def test_another_users_file_as_a_roots_output_is_not_its_log() -> None:
    """Root's process writing into a file `nobody` owns (planted where root's job logs):
    not the job's log, so the console never reads it as the job's."""
    with shared_tmp() as shared:
        planted = shared / "run.log"
        as_nobody("touch", str(planted))
        with open(planted, "ab") as out, running(out) as proc:
            assert stdout_path(f"/proc/{proc.pid}", os.getuid()) is None


def test_the_agents_sample_carries_a_ranks_stdout_file(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    client = AgentClient(InProcessChannel())
    client.start(gpus=False)
    try:
        with (
            open(log, "wb") as out,
            running(out, {"RANK": "0", "WORLD_SIZE": "1"}) as proc,
            running(subprocess.PIPE, {"RANK": "1", "WORLD_SIZE": "2"}) as piped,
        ):
            reply = client.request("sample", {"cpu": False, "gpus": False}, timeout=30)
            rows = process_rows(reply["processes"])
    finally:
        client.close()
    by_pid = {r.pid: r for r in rows}
    assert by_pid[proc.pid].stdout == str(log)
    assert by_pid[piped.pid].stdout is None


def _row(cmdline: str, stdout: str | None = None, user: str | None = "alice") -> ProcessRow:
    return ProcessRow(1, cmdline=cmdline, stdout=stdout, user=user)


def test_job_log_prefers_the_areal_directory_then_the_output_then_tensorboard() -> None:
    named = "python -m areal.infra.rpc.rpc_server --fileroot /fs --experiment-name e --trial-name t"
    tb = "python train.py stats_logger.tensorboard.path=/runs/tb"
    assert job_log([_row(named, "/home/alice/out.log")], "alice") == "/fs/logs/alice/e/t"
    assert job_log([_row(tb, "/home/alice/out.log")], "alice") == "/home/alice/out.log"
    assert job_log([_row(tb)], "alice") == "/runs/tb"
    # The file most of the job's processes share (a launcher and its ranks), not a stray one.
    rows = [_row("torchrun", "/l/job.log"), _row("python a", "/l/job.log"),
            _row("python b", "/l/other.log")]  # fmt: skip
    assert job_log(rows, "alice") == "/l/job.log"
    # Another user's process's output is not this user's job's log; `match` picks processes.
    assert job_log([_row("python x", "/home/bob/x.log", user="bob")], "alice") is None
    two = [_row("python a.py", "/a.log"), _row("python b.py", "/b.log")]
    assert job_log(two, "alice", r"b\.py") == "/b.log"
