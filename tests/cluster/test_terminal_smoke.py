"""The console in a real terminal: tmux runs it, keys are sent, the screen is read back."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import uuid

import pytest
from conftest import ROOT, GlooJob, cli_env, wait_for
from conftest import tmux_screen as screen
from conftest import tmux_showing as screen_with

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def test_console_in_tmux_shows_ranks_help_and_quits(gloo_job: GlooJob, tmp_path) -> None:
    session = f"areal-{uuid.uuid4().hex[:8]}"
    env = cli_env(TERM="xterm-256color")
    exports = " ".join(f"{k}={shlex.quote(env[k])}" for k in (
        "PYTHONPATH", "AREAL_CONSOLE_DATA_DIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "TERM"))  # fmt: skip
    command = f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES {exports} {shlex.quote(sys.executable)} -m areal_console; echo EXITED=$?; sleep 30"
    # Wide enough that the help table (at most 150 columns) keeps each description on one line.
    # COLUMNS/LINES from the test process would override the real terminal size: unset them.
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "170", "-y", "45", command],
                   check=True)  # fmt: skip
    try:
        wait_for(lambda: "nodes up" in screen(session), timeout=60, what="the console")
        pids = [str(p) for p in gloo_job.rank_pids().values()]
        # Other jobs may run here too: filter to this job (its work dir is in every command line).
        subprocess.run(["tmux", "send-keys", "-t", session, "/"], check=True)
        wait_for(
            lambda: screen_with(session, "filter: ranks (0-15,4095)"), timeout=15, what="the filter"
        )
        subprocess.run(
            ["tmux", "send-keys", "-t", session, "-l", str(gloo_job.workdir)], check=True
        )
        subprocess.run(["tmux", "send-keys", "-t", session, "Enter"], check=True)
        try:
            text = wait_for(lambda: screen_with(session, *pids), timeout=60, what="rank rows")
        except TimeoutError:
            raise AssertionError(f"rank pids {pids} not on screen:\n{screen(session)}") from None
        assert text.count("trainer") >= 4 and "launcher" in text
        assert "NVML unavailable" in text
        subprocess.run(["tmux", "send-keys", "-t", session, "?"], check=True)
        # Wait for the whole table, not its first frame: the modal may be caught mid-draw.
        try:
            help_text = wait_for(
                lambda: screen_with(session, "Keys — Cluster", "Filter nodes and processes"),
                timeout=15, what="the help screen",
            )  # fmt: skip
        except TimeoutError:
            raise AssertionError(f"no help table on screen:\n{screen(session)}") from None
        assert "Filter nodes and processes" in help_text
        subprocess.run(["tmux", "send-keys", "-t", session, "Escape"], check=True)
        wait_for(lambda: "Keys — Cluster" not in screen(session), timeout=15, what="help closed")
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        wait_for(lambda: "EXITED=0" in screen(session), timeout=20, what="a clean exit")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False, capture_output=True)
