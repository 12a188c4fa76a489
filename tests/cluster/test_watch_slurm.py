"""The Slurm recipe of docs/guide/watch.md, run as written on the real Slurm test cluster:
the watch as a small batch job beside a gloo training job (blocked in a barrier), reaching
its nodes with `srun --overlap`. Only the stall limits are shortened (the defaults wait 15
minutes), and `areal-console` and `$HOME/bin/notify-stall` are the ones the guide assumes:
a wrapper of this checkout on PATH and a script that records its environment."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import ROOT, wait_for

from tests.support.slurm_cluster import SlurmCluster

if TYPE_CHECKING:
    from conftest_slurm import SlurmGlooJob

pytest_plugins = ["conftest_slurm"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

GUIDE = ROOT / "docs" / "guide" / "watch.md"
FAST = "--stall-after 3 --interval 1"


def guide_script() -> str:
    """The batch script of the guide's "As a small Slurm job" section, as printed there."""
    text = GUIDE.read_text()
    section = text[text.index("### As a small Slurm job") :]
    found = re.search(r"```\n(#!/bin/bash\n.*?)```", section, re.S)
    assert found is not None, "the guide's Slurm script"
    return found.group(1)


def test_the_guides_slurm_recipe_watches_a_training_job(
    slurm_cluster: SlurmCluster, slurm_gloo_job: SlurmGlooJob, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    home.chmod(0o755)
    console = home / "bin" / "areal-console"
    path = os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])
    console.write_text(
        f'#!/bin/sh\nPYTHONPATH={path} exec {sys.executable} -m areal_console "$@"\n'
    )
    notify = home / "bin" / "notify-stall"
    notify.write_text(f"#!/bin/sh\nenv | grep '^AREAL_CONSOLE_' > {home}/notified\n")
    for script in (console, notify):
        script.chmod(0o755)
    script = guide_script()
    assert "srun areal-console watch --slurm-job TRAINING_JOB_ID" in script
    script = script.replace("TRAINING_JOB_ID --json", f"TRAINING_JOB_ID --json {FAST}")
    script = script.replace("TRAINING_JOB_ID", slurm_gloo_job.job_id)
    env = {"HOME": str(home), "PATH": f"{home / 'bin'}:{os.environ['PATH']}"}
    job = slurm_cluster.sbatch_env(script, env)
    out = Path(slurm_cluster.base) / f"slurm-{job}.out"
    try:
        slurm_cluster.wait_job_state(job, ("RUNNING",), timeout=60)

        def evidence() -> dict[str, object] | None:
            lines = out.read_text().splitlines() if out.exists() else []
            events = [json.loads(line) for line in lines if line.startswith("{")]
            return next((e for e in events if e["event"] == "evidence"), None)

        try:
            event = wait_for(evidence, timeout=150, what="the watch job's evidence")
        except TimeoutError as exc:
            log = out.read_text() if out.exists() else "(no output)"
            raise AssertionError(f"{exc}: {log[-3000:]}") from None
        folder = Path(str(event["evidence"]))
        assert folder.parent == home / "watch-evidence"
        stacks = json.loads((folder / "stacks.json").read_text())
        assert sorted(r["rank"] for r in stacks["ranks"] if r.get("rank") is not None) == list(
            range(slurm_gloo_job.world_size)
        )
        assert (folder / "report.md").is_file() and (folder / "servers.json").is_file()
        notified = wait_for(lambda: (home / "notified").exists() and (home / "notified").read_text(),
                            timeout=30, what="--exec to run")  # fmt: skip
        assert f"AREAL_CONSOLE_EVIDENCE={folder}\n" in notified
        assert f"AREAL_CONSOLE_REPORT={folder / 'report.md'}\n" in notified
    finally:
        slurm_cluster.run(["scancel", str(job)], check=False)
    # `scancel` sends SIGTERM: the watch stops between looks, with exit 0.
    slurm_cluster.wait_job_state(job, ("COMPLETED", "CANCELLED", "GONE", "FAILED"), timeout=60)
    assert "watch: stopped" in wait_for(
        lambda: "watch: stopped" in out.read_text() and out.read_text(),
        timeout=30, what="the watch to stop",
    ), out.read_text()[-2000:]  # fmt: skip
