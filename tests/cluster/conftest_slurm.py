"""Fixtures for the real Slurm test cluster (see `slurm_cluster.py`).

Registered with `pytest_plugins = ["conftest_slurm"]` by the Slurm test modules.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.slurm_cluster import SlurmCluster, free_port, skip_reason, start_cluster

JOBS = Path(__file__).resolve().parents[1] / "jobs"
SLURM_NODES = 3
RANKS_PER_NODE = 2


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A 3-node Slurm cluster on this machine. Skips, saying why, only where Slurm can't run
    (not installed, not root); a cluster that fails to start is an error of every test
    that uses it (`SlurmStartError`, with the daemons' last log lines)."""
    reason = skip_reason()
    if reason:
        pytest.skip(f"no test Slurm cluster: {reason}")
    cluster = start_cluster(SLURM_NODES)
    try:
        yield cluster
    finally:
        cluster.cleanup()


@dataclass
class SlurmGlooJob:
    job_id: str
    ready_dir: Path
    nodes: int
    ranks_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


def submit_gloo_job(
    cluster: SlurmCluster, nodes: int, ranks_per_node: int, port: int, gpus: int = 1
) -> SlurmGlooJob:
    """`sbatch` a real gloo job (ranks from SLURM_PROCID etc.) and wait until every rank is up."""
    ready = Path(tempfile.mkdtemp(prefix="ready-", dir=cluster.base))
    job_id = cluster.sbatch(
        (JOBS / "slurm_gloo.sh").read_text(),
        f"--nodes={nodes}",
        f"--ntasks-per-node={ranks_per_node}",
        f"--gres=gpu:{gpus}",
        "--job-name=gloo-ranks",
        f"--chdir={ready}",
        f"--output={ready}/job.log",
        args=(sys.executable, str(JOBS / "gloo_ranks.py"), str(ready), str(port)),
    )
    total = nodes * ranks_per_node
    deadline = time.monotonic() + 120
    while len(list(ready.glob("rank*.ready"))) < total:
        if cluster.job_state(job_id) not in ("PENDING", "RUNNING", "CONFIGURING"):
            log = (ready / "job.log").read_text() if (ready / "job.log").exists() else ""
            raise RuntimeError(f"gloo job {job_id} ended early: {log[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gloo job {job_id}: ranks did not all start")
        time.sleep(0.2)
    return SlurmGlooJob(str(job_id), ready, nodes, ranks_per_node)


class GlooJobs:
    """The session's gloo job, submitted when first asked for and again after a test that
    ended its ranks said so (`spoil`): tests after it get a healthy job, not a step whose
    ranks are gone."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster
        self.job: SlurmGlooJob | None = None

    def get(self) -> SlurmGlooJob:
        if self.job is not None and self.cluster.job_state(self.job.job_id) != "RUNNING":
            self.spoil()
        if self.job is None:
            self.job = submit_gloo_job(self.cluster, SLURM_NODES, RANKS_PER_NODE, free_port())
        return self.job

    def spoil(self) -> None:
        """The job's ranks are (about to be) gone: cancel it; the next test gets a new one."""
        if self.job is not None:
            self.cluster.run(["scancel", self.job.job_id], check=False)
            self.job = None


@pytest.fixture(scope="session")
def slurm_gloo_jobs(slurm_cluster: SlurmCluster) -> Iterator[GlooJobs]:
    jobs = GlooJobs(slurm_cluster)
    try:
        yield jobs
    finally:
        jobs.spoil()


@pytest.fixture
def slurm_gloo_job(slurm_gloo_jobs: GlooJobs) -> SlurmGlooJob:
    """3 nodes x 2 ranks of a gloo job blocked in a barrier, submitted with sbatch (one for
    the session, unless a test ended its ranks)."""
    return slurm_gloo_jobs.get()
