"""The threat model in one place: hostile or unlucky inputs, and what the console does.

Each test below reproduces one way an input broke the console, and checks the fix: a clear
one-line error (no traceback), the exit code of the contract (0 ok, 1 runtime error,
2 usage or bad value, 3 partial), and the rest of the work carrying on. The threats:

1. terminal escapes in remote text (process command lines, frame and file names);
2. the node's agent cache (planted symlinks, foreign or shared directories, FIFOs);
3. YAML alias bombs and huge values in the inventory and settings files;
4. `@cert-authority` / `@revoked` lines in known_hosts;
5. every command that reaches nodes honours the same target options;
6. the Slurm hostlist grammar (checked against the real `scontrol show hostnames`);
7. unreadable `.pt` files in a dump directory;
8. a malformed saved capture among good ones;
9. a node whose python3 is too old for the agent;
10. the CLI contract (exit codes, warnings, bad values, torch noise, random bytes);
11. launch templates: fields substituted in the template only, never inside values;
12. bounded waits (an SSH banner without a newline, the agent start);
13. a frozen (SIGSTOPped) agent, told apart from a dropped connection;
14. through Slurm, the node's interpreter resolved on the node.

Cases that need the sshd test cluster or the Slurm cluster live in test_ssh.py,
test_fleet_cluster.py and test_slurm.py; they are listed by name at the end of this file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli, wait_for

ESC = "\x1b"
HOSTILE_ARG = "\x1b]0;pwned\x07\x1b[2J\x9b31m[red]markup[/bold]"


# --------------------------------------------------------------------------------------
# 1. terminal escapes in remote text

HOSTILE_RANK = r"""
import sys, time
def hang():
    time.sleep(600)
name = "hang\x1b]0;pwned\x07\x1b[2J"
code = hang.__code__.replace(co_name=name)
if hasattr(code, "co_qualname"):
    code = code.replace(co_qualname=name)
hang.__code__ = code
exec(compile("print('ready', flush=True)\nhang()", "/tmp/evil\x1b[31m.py", "exec"))
"""


@pytest.fixture(scope="module")
def hostile_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[str]]:
    """A real process posing as rank 0, with escape sequences in its argv, its function
    name and its file name."""
    where = tmp_path_factory.mktemp("hostile")
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    proc = subprocess.Popen(
        [sys.executable, "-", HOSTILE_ARG, where.name],  # the script on stdin: a short argv
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(HOSTILE_RANK)
    proc.stdin.close()
    assert proc.stdout.readline().strip() == "ready"
    proc.marker = where.name  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_nodes_text_escapes_control_characters(hostile_rank: subprocess.Popen[str]) -> None:
    for extra in ([], ["--all"]):
        result = run_cli("nodes", "--local", *extra)
        assert result.returncode == 0, result.stderr
        assert ESC not in result.stdout and "\x9b" not in result.stdout and "\x07" not in result.stdout
        line = next(ln for ln in result.stdout.splitlines() if str(hostile_rank.pid) in ln)
        assert "\\x1b]0;pwned\\x07" in line or "\\x1b]0;pwn" in line


def test_stacks_text_escapes_frame_and_file_names(hostile_rank: subprocess.Popen[str]) -> None:
    result = run_cli("stacks", "--local", "--match", hostile_rank.marker)  # type: ignore[attr-defined]
    assert result.returncode == 0, result.stderr
    assert ESC not in result.stdout and "\x07" not in result.stdout
    assert "hang\\x1b]0;pwned\\x07\\x1b[2J" in result.stdout
    assert "/tmp/evil\\x1b[31m.py" in result.stdout


async def test_cluster_and_stacks_screens_escape_remote_text(
    hostile_rank: subprocess.Popen[str],
) -> None:
    from areal_console.app import ConsoleApp
    from areal_console.core.fleet import Fleet
    from areal_console.core.stacks.capture import CaptureOptions, take_capture
    from areal_console.core.targets import local_node
    from areal_console.screens.stacks import StacksScreen
    from areal_console.widgets.process_table import ProcessTable

    fleet = Fleet([local_node()])
    app = ConsoleApp(fleet, refresh_interval=0.2)
    key = f"{local_node().name}:{hostile_rank.pid}"
    async with app.run_test(size=(200, 40)) as pilot:
        table = app.screen.query_one(ProcessTable)
        deadline = time.monotonic() + 30
        while key not in table.rows:
            assert time.monotonic() < deadline, "the hostile rank never appeared"
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        svg = app.export_screenshot()
        assert ESC not in svg and "\x9b" not in svg
        assert "\\x1b]0;pwned\\x07" in svg.replace("&#x27;", "'")
        assert "[red]markup[/bold]" in svg  # shown as text, not read as markup

        capture = take_capture(
            fleet,
            CaptureOptions(match=hostile_rank.marker),  # type: ignore[attr-defined]
            save=False,
        )
        screen = StacksScreen(capture)
        await app.push_screen(screen)
        deadline = time.monotonic() + 30
        while screen.analysis is None:
            assert time.monotonic() < deadline
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        svg = app.export_screenshot()
        assert ESC not in svg and "\x07" not in svg
        assert "hang\\x1b]0;pwned" in svg
