"""A capture that got nothing says why for each rank and fails (a real job, a real agent,
py-spy really absent from the agent's PATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from areal_console.core.stacks.diagnose import diagnose, failure_reasons
from areal_console.core.stacks.merge import analyse
from areal_console.core.stacks.store import load_capture
from conftest import GlooJob, cli_env


def without_pyspy(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A python whose own directory and PATH hold no py-spy (as on a node without it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3"
    python.symlink_to(os.path.realpath(sys.executable))
    env = cli_env(PATH=f"{bin_dir}:/usr/bin:/bin")
    return str(python), env


def test_no_pyspy_says_why_per_rank_and_exits_1(gloo_job: GlooJob, tmp_path: Path) -> None:
    python, env = without_pyspy(tmp_path)
    check = subprocess.run([python, "-c", "import shutil; print(shutil.which('py-spy'))"],
                           env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert check.stdout.strip() == "None"
    args = ["-m", "areal_console", "stacks", "--local", "--match", str(gloo_job.workdir)]
    text = subprocess.run([python, *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert text.returncode == 1, text.stderr
    assert text.stderr.count("\n") == 1 and "Traceback" not in text.stderr
    assert text.stderr.startswith(
        "error: no rank captured: 4 ranks found, no stack dumped: ranks 0-3: py-spy not found"
    )
    assert "DIAGNOSIS [none] Nothing captured: no rank's stack could be read" in text.stdout
    assert "ranks 0-3: py-spy not found on this node: pip install py-spy" in text.stdout
    doc = json.loads(subprocess.run([python, *args, "--json"], env=env, capture_output=True,
                                    text=True, timeout=120, check=False).stdout)  # fmt: skip
    assert doc["diagnosis"]["pattern"] == "none"
    assert "--match" not in " ".join(doc["diagnosis"]["suggestions"])
    capture = load_capture(doc["id"])
    failed = [r for r in capture.rank_stacks if r.state != "ok"]
    assert len(failed) == 4
    assert failure_reasons(failed) == [
        "ranks 0-3: py-spy not found on this node: pip install py-spy"
    ]
    assert diagnose(analyse(capture)).evidence[0] == failure_reasons(failed)[0]
