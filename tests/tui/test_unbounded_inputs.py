"""Work the console does on input others control has bounds: a py-spy text import (a
million frames, an endless stdin) is refused in one line, and processes with megabyte
command lines cost the console kilobytes (`nodes --json`, the TUI's process rows)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.connection.fleet import Fleet
from areal_console.core.connection.records import MAX_CMDLINE
from areal_console.core.targets.resolve import local_node
from areal_console.widgets.process_table import ProcessTable

from tests.conftest import cli_env, run_cli
from tests.support.waits import until

PROCESSES = 20
ARG = 130_000  # under Linux's 128 KiB per argument
ARGS = 8  # ~1 MB of command line each


def test_an_import_of_a_million_frames_is_refused_quickly(tmp_path: Path) -> None:
    dump = tmp_path / "rank0.txt"
    lines = ["Process 1: python train.py", "Python v3.11.7", 'Thread 1 (active): "MainThread"']
    lines += [f"    f{i % 5000} (/a/b{i % 300}.py:{i % 1000})" for i in range(1_000_000)]
    dump.write_text("\n".join(lines) + "\n")
    # Refused by the frame count, not imported (that took 20 s and 1.5 GB): the message
    # says so; run_cli's timeout is the bound on a hang.
    result = run_cli("stacks", "--import", str(dump))
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: --import: ") and result.stderr.count("\n") == 1
    assert "process 1 has more than 50,000 frames" in result.stderr


def test_an_endless_stdin_import_is_one_line() -> None:
    with open("/dev/zero", "rb") as zero:
        result = subprocess.run(
            ["python", "-m", "areal_console", "stacks", "--import", "-"],
            stdin=zero,
            capture_output=True,
            text=True,
            timeout=60,
            env=cli_env(),
            check=False,
        )
    assert result.returncode == 1, result.stderr
    assert result.stderr == "error: --import: stdin: larger than 64 MB: not a py-spy dump " \
        "(import fewer ranks at a time)\n"  # fmt: skip


def test_binary_text_to_import_is_one_line(tmp_path: Path) -> None:
    dump = tmp_path / "rank0.txt"
    dump.write_bytes(b"\0" * 1000)
    result = run_cli("stacks", "--import", str(dump))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "binary data" in result.stderr


@pytest.fixture(scope="module")
def long_command_lines() -> Iterator[str]:
    """PROCESSES ranks (`tail -f /dev/null`, light) with ~1 MB command lines each."""
    tail = shutil.which("tail")
    assert tail is not None
    marker = f"longcmd{os.getpid()}"
    procs = []
    try:
        for rank in range(PROCESSES):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(PROCESSES), LOCAL_RANK="0")
            args = [f"{marker}-{rank}-" + "a" * ARG for _ in range(ARGS)]
            procs.append(subprocess.Popen([tail, "-f", "/dev/null", "--", *args], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        yield marker
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_nodes_json_caps_each_command_line(long_command_lines: str) -> None:
    result = run_cli("nodes", "--local", "--json")
    assert result.returncode == 0, result.stderr
    procs = [p for n in json.loads(result.stdout)["nodes"] for p in n["processes"]]
    ours = [p for p in procs if long_command_lines in p["cmdline"]]
    assert len(ours) == PROCESSES
    for p in ours:
        assert len(p["cmdline"]) < MAX_CMDLINE + 100
        assert p["cmdline"].endswith(" more characters)")
    assert len(result.stdout) < 2 * PROCESSES * MAX_CMDLINE + (1 << 20)  # was ~20 MB


async def test_the_process_table_holds_capped_command_lines(long_command_lines: str) -> None:
    fleet = Fleet([local_node()])
    app = ConsoleApp(fleet, refresh_interval=0.5)
    async with app.run_test(size=(200, 50)) as pilot:
        table = app.screen.query_one(ProcessTable)

        def ours() -> list[object]:
            rows = [r for view in app.monitor.snapshot() for r in view.processes]
            return [r for r in rows if long_command_lines in r.cmdline]

        await until(pilot, lambda: len(ours()) == PROCESSES, what="the long command lines")
        await until(pilot, lambda: table.row_count >= PROCESSES, what="the rows drawn")
        for row in ours():
            assert len(row.cmdline) < MAX_CMDLINE + 100  # type: ignore[attr-defined]
            assert len(row.raw["cmdline"]) < MAX_CMDLINE + 100  # type: ignore[attr-defined]
