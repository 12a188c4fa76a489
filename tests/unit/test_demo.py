"""`areal-console demo`: README's main command, end to end in a real terminal."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import ROOT, cli_env, run_cli, wait_for
from conftest import tmux_showing as showing

from tests.support.signals import sigint_default

pytestmark = pytest.mark.slow


def demo_processes(tmp: Path) -> list[int]:
    """PIDs whose command line mentions a demo work dir under `tmp`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if f"{tmp}/areal-console-demo-" in cmd:
                out.append(int(entry.name))
    return out


@contextmanager
def headless_demo(tmp: Path, pattern: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """`demo --no-tui --pattern P` with TMPDIR=`tmp`, once its job is ready: the process
    and its stderr lines up to `job ready`. Whatever is left of it is killed after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_console", "demo", "--no-tui", "--pattern", pattern],
        stderr=subprocess.PIPE, text=True, env=cli_env(TMPDIR=str(tmp)),
        preexec_fn=sigint_default,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "job ready" in line:
                break
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in demo_processes(tmp):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_demo_diagnoses_the_hang_shows_batches_and_cleans_up(tmp_path: Path) -> None:
    tmp_path = tmp_path / "tmp"  # the demo's TMPDIR, and nothing else
    tmp_path.mkdir()
    session = f"demo-{uuid.uuid4().hex[:8]}"
    env = cli_env(TERM="xterm-256color", TMPDIR=str(tmp_path))
    names = (
        "PYTHONPATH",
        "AREAL_CONSOLE_DATA_DIR",
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "TERM",
        "TMPDIR",
    )
    exports = " ".join(f"{k}={shlex.quote(env[k])}" for k in names)
    command = (f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES {exports} {shlex.quote(sys.executable)} "
               "-m areal_console demo --pattern cleanup; echo EXITED=$?; sleep 60")  # fmt: skip
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "42", command],
                   check=True)  # fmt: skip
    try:
        # The job's two ranks and its launcher, filtered to the demo job.
        wait_for(lambda: showing(session, "nodes up", "0/2", "1/2", "launcher"), timeout=240,
                 what="the demo's ranks")  # fmt: skip
        subprocess.run(["tmux", "send-keys", "-t", session, "s"], check=True)
        text = wait_for(lambda: showing(session, "cleanup_deadlock"), timeout=120,
                        what="the diagnosis")  # fmt: skip
        assert "cleanup_distributed" in text and "all_reduce_gradients" in text
        subprocess.run(["tmux", "send-keys", "-t", session, "3"], check=True)
        text = wait_for(lambda: showing(session, "AReaL trajectory dump"), timeout=60,
                        what="the dumped batches")  # fmt: skip
        assert "no_eos_ratio" in text
        # Training health from the job's own AReaL-format log: the drift, then the stall.
        subprocess.run(["tmux", "send-keys", "-t", session, "5"], check=True)
        text = wait_for(lambda: showing(session, "STALLED", "behave_imp_weight/avg ="),
                        timeout=90, what="the Health view's stall and drift")  # fmt: skip
        assert "rollout.max_head_offpolicyness" in text
        assert len(demo_processes(tmp_path)) >= 3  # launcher and two ranks
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        wait_for(lambda: showing(session, "EXITED=0"), timeout=60, what="a clean exit")
        assert demo_processes(tmp_path) == []
        assert list(tmp_path.iterdir()) == []  # its files, torchrun's scratch files included
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False, capture_output=True)
        for pid in demo_processes(tmp_path):
            os.kill(pid, signal.SIGKILL)


def test_demo_ctrl_c_stops_everything(tmp_path: Path) -> None:
    with headless_demo(tmp_path, "mismatch") as (proc, lines):
        assert proc.stderr is not None
        assert any("3/3 steps dumped" in line for line in lines), lines
        dumps = sorted(p.name for p in tmp_path.glob("areal-console-demo-*/dump/step_*.pt"))
        assert dumps == [f"step_00000{s}_dp_{r}.pt" for s in (0, 1, 2) for r in (0, 1)]
        assert len(demo_processes(tmp_path)) >= 3
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 130
        assert "stopped the demo job" in rest and "Traceback" not in rest
        assert demo_processes(tmp_path) == []
        assert list(tmp_path.glob("areal-console-demo-*")) == []


def test_demo_killed_takes_its_job_along_and_the_next_demo_removes_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL runs no cleanup: the job's processes (own sessions, hung in a collective) die
    with the console, and the next demo removes the folder it left, and only that one."""
    import tempfile

    from areal_console.core.replay.demo import OWNER_FILE, new_demo, owner_line

    with headless_demo(tmp_path, "mismatch") as (proc, _):
        (left,) = tmp_path.glob("areal-console-demo-*")
        assert (left / OWNER_FILE).read_text().split()[2] == str(proc.pid)
        job = demo_processes(tmp_path)
        assert len(job) >= 3, job  # the trainer, torchrun, two ranks
        proc.kill()
        proc.wait(timeout=30)
        wait_for(lambda: not demo_processes(tmp_path), timeout=30)
        assert left.is_dir()  # nothing ran to remove it
        # Beside it, folders a demo must not touch: one whose owner lives (this process),
        # one it cannot prove is a demo's, and a link to a stale one.
        live = tmp_path / "areal-console-demo-live"
        live.mkdir()
        (live / OWNER_FILE).write_text(owner_line(os.getpid()))
        unknown = tmp_path / "areal-console-demo-other"
        unknown.mkdir()
        target = tmp_path / "elsewhere"
        target.mkdir()
        (target / OWNER_FILE).write_text((left / OWNER_FILE).read_text())
        (tmp_path / "areal-console-demo-link").symlink_to(target)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        nxt = new_demo("none")  # the next demo, before it starts anything
        assert not left.exists()
        assert (
            live.is_dir()
            and unknown.is_dir()
            and target.is_dir()
            and (target / OWNER_FILE).exists()
        )
        assert (tmp_path / "areal-console-demo-link").is_symlink()
        nxt.remove_files()


def test_demo_bad_input_is_one_line() -> None:
    result = run_cli("demo", "--nproc", "1")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: the demo needs at least 2 ranks (--nproc 2 or more)"


def test_demo_collective_pattern_is_named_from_the_ledger(tmp_path: Path) -> None:
    """`--pattern collective`: the stacks look alike (one all_reduce line), the Flight
    Recorder shows each rank on its own group: a deadlock between groups, not a network problem."""
    with headless_demo(tmp_path, "collective") as (proc, _):
        (workdir,) = tmp_path.glob("areal-console-demo-*")
        out = run_cli("stacks", "--local", "--match", str(workdir), "--json")
        assert out.returncode == 0, out.stderr
        diagnosis = json.loads(out.stdout)["diagnosis"]
        assert diagnosis["pattern"] == "cross_group_deadlock"
        assert diagnosis["title"] == (
            "Cross-group deadlock: ranks 0-1 wait on each other across groups 2, 3"
        )
        assert "each waits for a rank blocked in another group" in diagnosis["detail"]
        assert not any("network" in s for s in diagnosis["suggestions"])
        assert "Flight Recorder: group 2: rank 1 is 1 call behind" in diagnosis["evidence"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
