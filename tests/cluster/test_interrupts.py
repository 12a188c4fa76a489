"""Ctrl-C stops at once, everywhere, with exit status 130: a multi-sample capture, a
`replay --wait`, and the console itself."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.connection.fleet import Fleet
from areal_console.core.replay import runs as jobs
from areal_console.core.targets.resolve import local_node
from conftest import GlooJob, cli_env

from tests.support.fixtures import batch_dumps as bf
from tests.support.signals import sigint_default

SLOW_SCRIPT = "import time\nfor i in range(600):\n    print(f'working {i}', flush=True)\n    time.sleep(0.5)\n"


class Cli:
    """`python -m areal_console ARGS` with its stderr read line by line as it comes."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "areal_console", *args], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=sigint_default,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert self.proc.stderr is not None
        stderr = self.proc.stderr
        self.reader = threading.Thread(
            target=lambda: [self.lines.put(x) for x in stderr], daemon=True
        )
        self.reader.start()

    def wait_for_line(self, needle: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if needle in line:
                return line
        raise AssertionError(f"no stderr line with {needle!r}; saw {self.seen}")

    def interrupt(self) -> float:
        """SIGINT (what Ctrl-C sends); seconds until the process is gone."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)
        elapsed = time.monotonic() - t0
        self.reader.join(timeout=10)  # the reader has drained the pipe (EOF)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return elapsed


@pytest.mark.slow
def test_ctrl_c_stops_a_long_capture_at_once(gloo_job: GlooJob) -> None:
    cli = Cli("stacks", "--local", "--match", str(gloo_job.workdir), "--samples", "120",
              "--interval", "1", env=cli_env())  # fmt: skip
    try:
        cli.wait_for_line("sample 2/120")
        elapsed = cli.interrupt()
    finally:
        cli.proc.kill()
    assert cli.proc.returncode == 130
    # It stops within a second or so; the samples left would take ~118 s.
    assert elapsed < 15, f"took {elapsed:.1f}s to stop"
    assert "interrupted" in "".join(cli.seen)
    assert "Traceback" not in "".join(cli.seen)


@pytest.mark.slow
def test_ctrl_c_while_replay_waits_says_the_job_keeps_running(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("launch_templates:\n  slow: '{python} {script}'\n")
    script = tmp_path / "slow.py"
    script.write_text(SLOW_SCRIPT)
    dump = tmp_path / "dump"
    bf.write_trajectory_dump(dump, steps=[0], dp_size=1, n_groups=1, group_size=2)
    env = cli_env(AREAL_CONSOLE_CONFIG=str(config))
    cli = Cli("replay", str(dump), "--local", "--template", "slow", "--script", str(script),
              "--python", sys.executable, "--gpus", "cpu", "--wait", env=env)  # fmt: skip
    try:
        started = cli.wait_for_line("waiting for it to end")
        assert "Ctrl-C stops waiting, the job keeps running" in started
        cli.wait_for_line(": working ")  # progress: the log's newest line
        elapsed = cli.interrupt()
    finally:
        cli.proc.kill()
    assert cli.proc.returncode == 130 and elapsed < 15  # the job would run for 300 s
    said = "".join(cli.seen)
    assert "keeps running" in said and "stopped waiting" in said, said
    job_id = started.split("replay ", 1)[1].split()[0]
    # The detached job really does keep running; stop it here.
    fleet = Fleet([local_node()])
    try:
        record = next(r for r in jobs.load_runs() if r.job_id == job_id)
        session = fleet.sessions[0]
        assert jobs.refresh(session, record).state == "running"
        jobs.stop(session, record, grace=2)
    finally:
        fleet.close()


async def test_ctrl_c_quits_the_console_from_anywhere(gloo_job: GlooJob) -> None:
    """Not Textual's "press ctrl+q to quit": Ctrl-C leaves at once, even from an input box."""
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.5)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("slash")  # the filter box has focus and takes ctrl+c for copy
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 130
