"""A capture that got nothing says why for each rank and fails (real ranks, a real agent,
py-spy really absent from the agent's PATH and from beside the ranks' interpreter); with
py-spy beside the job's interpreter, that one is used."""

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


NO_PYSPY = "py-spy not found on this node: pip install py-spy"
NO_WORKER_SERVER = "no worker server: none found (the launch hook, TORCH_WORKER_SERVER_SOCKET or start_debug_server: docs/guide/stacks.md)"
SYSTEM_PYTHON = "/usr/bin/python3"  # no py-spy beside it (checked below)


def test_pyspy_beside_the_jobs_interpreter_is_used(gloo_job: GlooJob, tmp_path: Path) -> None:
    """None on the agent's PATH nor beside its Python: the one next to the ranks' own
    interpreter (root's, and every directory above it root's) dumps them."""
    python, env = without_pyspy(tmp_path)
    args = ["-m", "areal_console", "stacks", "--local", "--match", str(gloo_job.workdir), "--json"]
    result = subprocess.run([python, *args], env=env, capture_output=True, text=True,
                            timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    ranks = json.loads(result.stdout)["ranks"]
    assert [(r["state"], r["source"]) for r in ranks] == [("ok", "py-spy")] * 4


def test_no_pyspy_says_why_per_rank_and_exits_1(tmp_path: Path) -> None:
    """Ranks whose interpreter has no py-spy beside it, and no worker server: nothing to
    read them with."""
    assert not (Path(os.path.realpath(SYSTEM_PYTHON)).parent / "py-spy").exists()
    python, env = without_pyspy(tmp_path)
    check = subprocess.run([python, "-c", "import shutil; print(shutil.which('py-spy'))"],
                           env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert check.stdout.strip() == "None"
    marker = f"no-pyspy-{tmp_path.name}"
    ranks = [
        subprocess.Popen([SYSTEM_PYTHON, "-c", "import time; time.sleep(600)", marker],
                         env={"RANK": str(r), "WORLD_SIZE": "4", "PATH": "/usr/bin:/bin"})
        for r in range(4)
    ]  # fmt: skip
    try:
        args = ["-m", "areal_console", "stacks", "--local", "--match", marker]
        text = subprocess.run([python, *args], env=env, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
        doc = json.loads(subprocess.run([python, *args, "--json"], env=env, capture_output=True,
                                        text=True, timeout=120, check=False).stdout)  # fmt: skip
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait(timeout=30)
    assert text.returncode == 1, text.stderr
    assert text.stderr.count("\n") == 1 and "Traceback" not in text.stderr
    assert text.stderr.startswith(
        f"error: no rank captured: 4 ranks found, no stack dumped: ranks 0-3: {NO_PYSPY}; "
    )
    assert "DIAGNOSIS [none] Nothing captured: no rank's stack could be read" in text.stdout
    assert f"ranks 0-3: {NO_PYSPY}; {NO_WORKER_SERVER}" in text.stdout
    assert doc["diagnosis"]["pattern"] == "none"
    assert "--match" not in " ".join(doc["diagnosis"]["suggestions"])
    capture = load_capture(doc["id"])
    failed = [r for r in capture.rank_stacks if r.state != "ok"]
    assert len(failed) == 4
    assert failure_reasons(failed) == [f"ranks 0-3: {NO_PYSPY}; {NO_WORKER_SERVER}"]
    assert diagnose(analyse(capture)).evidence[0] == failure_reasons(failed)[0]
