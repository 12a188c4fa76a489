"""An AReaL job run by AReaL's Slurm scheduler, on the real local Slurm cluster: one sbatch
job per role named `{experiment}_{trial}:{role}` (areal/infra/scheduler/slurm.py:165-166),
workers indexed by SLURM_PROCID that register in nfs name-resolve themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import JOBS, ROOT, wait_for

from tests.support.slurm_cluster import SlurmCluster

pytest_plugins = ["conftest_slurm"]

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

USER = "root" if os.geteuid() == 0 else os.environ.get("USER", "")
EXPERIMENT, TRIAL = "exp", "slurm1"


@dataclass
class ArealSlurmJob:
    job_id: str
    root: Path
    name: str


@pytest.fixture(scope="module")
def areal_slurm_job(slurm_cluster: SlurmCluster) -> Iterator[ArealSlurmJob]:
    """The actor role: 2 nodes x 1 task, submitted as AReaL's scheduler names it."""
    base = Path(tempfile.mkdtemp(prefix="areal-", dir=slurm_cluster.base))
    root, fileroot = base / "name_resolve", base / "fileroot"
    name = f"{EXPERIMENT}_{TRIAL}:actor"
    job_id = slurm_cluster.sbatch(
        (JOBS / "areal_slurm_role.sh").read_text(),
        "--nodes=2",
        "--ntasks-per-node=1",
        f"--job-name={name}",
        "--output=/dev/null",
        args=(sys.executable, str(JOBS / "areal_stub"), str(root), str(fileroot),
              EXPERIMENT, TRIAL, "actor"),
    )  # fmt: skip
    workers = root / USER / EXPERIMENT / TRIAL / "workers" / "actor"
    try:
        wait_for(lambda: len(list(workers.glob("*/ENTRY"))) == 2, 120, "both workers' records")
        yield ArealSlurmJob(str(job_id), root, name)
    finally:
        slurm_cluster.run(["scancel", str(job_id)], check=False)


def console(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = cluster.env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])
    return subprocess.run(
        [sys.executable, "-m", "areal_console", *args],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip


def test_areal_finds_the_roles_slurm_job_by_name(
    slurm_cluster: SlurmCluster, areal_slurm_job: ArealSlurmJob
) -> None:
    result = console(slurm_cluster, "nodes", "--areal", f"{EXPERIMENT}/{TRIAL}",
                     "--name-resolve-root", str(areal_slurm_job.root), "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["areal"]["slurm_jobs"] == [f"{areal_slurm_job.job_id} ({areal_slurm_job.name})"]
    assert [n["state"] for n in doc["nodes"]] == ["up", "up"]
    assert {n["name"] for n in doc["nodes"]} == {"node1", "node2"}
    workers = [p for n in doc["nodes"] for p in n["processes"] if p["role"] == "actor"]
    # No --worker-index on the command line: index and rank come from SLURM_PROCID.
    assert sorted((p["worker_index"], p["rank"]) for p in workers) == [(0, 0), (1, 1)]
    assert all("--worker-index" not in p["cmdline"] for p in workers)
    assert {e["state"] for e in doc["areal"]["entries"]} == {"ok"}


def test_slurm_job_accepts_the_roles_job_name(
    slurm_cluster: SlurmCluster, areal_slurm_job: ArealSlurmJob
) -> None:
    result = console(slurm_cluster, "nodes", "--slurm-job", areal_slurm_job.name, "--json")
    assert result.returncode == 0, result.stderr
    assert (
        f"note: Slurm job {areal_slurm_job.job_id} is the one named '{areal_slurm_job.name}'"
        in result.stderr
    )
    assert len(json.loads(result.stdout)["nodes"]) == 2
    unknown = console(slurm_cluster, "nodes", "--slurm-job", "exp_nope:actor")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("error: no Slurm job named 'exp_nope:actor' in the queue")
