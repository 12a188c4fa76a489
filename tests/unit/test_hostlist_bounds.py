"""Host lists are counted before they are built. `a[0-65535]b[0-65535]` has two brackets
of 65,536 numbers each, each under the cap; multiplied out it is 4.3e9 names, and the old
expansion built them before checking (`report --anonymize` on a job whose command line
said `MASTER_ADDR=a[0-65535]b[0-65535]`: a MemoryError traceback after 13 s). Every
expansion (`--hosts`, inventories, Slurm's node lists, the report's MASTER_ADDR and
SLURM_JOB_NODELIST) goes through `expand_hostlist`, which counts first."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.core.common.errors import UserError
from areal_console.core.targets.hostlist import MAX_HOSTS, expand_hostlist, hostlist_size

from tests.support.nobody import NOBODY, NOBODY_PYTHON, needs_nobody
from tests.support.waits import wait_for

HUGE = "a[0-65535]b[0-65535]"


@pytest.mark.parametrize(
    "expr",
    [HUGE, "x[0-99999999999999999999]", "a[0-255]b[0-255]c[0-1]", "a[0-65535],b[0-1]",
     ",".join(["n[0-65535]"] * 1000)],
)  # fmt: skip
def test_too_many_names_are_refused_by_count(expr: str) -> None:
    t0 = time.process_time()
    with pytest.raises(UserError, match=f"more than {MAX_HOSTS:,} hosts") as refused:
        expand_hostlist(expr)
    with pytest.raises(UserError):
        hostlist_size(expr)
    assert "\n" not in str(refused.value)
    assert time.process_time() - t0 < 1.0  # nothing was built (building took 13 s and failed)


def test_counting_agrees_with_building() -> None:
    for expr in ("n[01-03,7],gpu[1-2]x[1-4]", "a[1-2]b[3-4]c[5-6]", "a[0-65535]", "b", "a,,b"):
        assert hostlist_size(expr) == len(expand_hostlist(expr))
    assert expand_hostlist("a[1-2]b[3-4]c[5-6]")[:3] == [
        "a1b3c5",
        "a1b3c6",
        "a2b3c5",
    ]  # Slurm's order


def cmdline(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:  # the process ended
        return ""


@pytest.fixture()
def hostile_rank() -> Iterator[str]:
    """A rank of another user's job (`nobody`) naming a host list of 4.3e9 names on its
    command line and in its environment."""
    tag = f"hostlist-bomb-{os.getpid()}"
    env = ["env", "RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=1", f"SLURM_JOB_NODELIST=s{HUGE}"]
    code = "import sys, time; time.sleep(120)"
    proc = subprocess.Popen([*NOBODY, *env, NOBODY_PYTHON, "-c", code, tag, f"MASTER_ADDR={HUGE}"])
    try:
        wait_for(lambda: any(tag in cmdline(p) for p in Path("/proc").glob("[0-9]*/cmdline")),
                 timeout=20, what="the planted rank")  # fmt: skip
        yield tag
    finally:
        proc.kill()
        proc.wait()


@needs_nobody
def test_report_anonymize_on_a_job_naming_a_huge_host_list(
    hostile_rank: str, tmp_path: Path
) -> None:
    out = tmp_path / "r.md"
    argv = [sys.executable, "-m", "areal_console", "report", "--local", "--match", hostile_rank,
            "--anonymize", "-o", str(out)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode in (0, 3), result.stderr
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    md = out.read_text()
    assert hostile_rank in md  # the rank was read: its command line is in the report
    assert HUGE not in md  # the list's own text is anonymized
