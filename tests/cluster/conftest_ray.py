"""Fixtures for the real Ray test cluster (see `ray_cluster.py`).

Registered with `pytest_plugins = ["conftest_ray"]` by the Ray test modules: one cluster
per test session, shared by every Ray test, stopped at the end.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fixtures.hang import free_port
from tests.support.ray_cluster import RayCluster, skip_reason, start_cluster
from tests.support.waits import wait_for

REPO = Path(__file__).resolve().parents[2]
RAY_GLOO = REPO / "tests" / "jobs" / "ray_gloo.py"
RAY_NODES = 2


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A head on 127.0.0.2 and a node on 127.0.0.3. Skips, saying why, only where Ray can't
    run (the [ray] extra not installed, not root); a cluster that fails to start is an
    error of every test that uses it (`RayStartError`, with the nodes' last log lines)."""
    reason = skip_reason()
    if reason:
        pytest.skip(f"no test Ray cluster: {reason}")
    cluster = start_cluster(RAY_NODES)
    try:
        yield cluster
    finally:
        cluster.stop()


@dataclass
class RayGlooJob:
    driver: subprocess.Popen[bytes]
    state_dir: Path
    world_size: int


class RayGlooJobs:
    """The session's gloo job, started on first use and again after a test spoiled it.

    A test that takes a node of the shared cluster away (`test_node_lost_mid_session`)
    starts the node again when it is done (`RayCluster.restart_node`) and calls `spoil()`:
    the job lost its ranks there, so the next test that asks for the job (in any module,
    in any order) gets a new one on the restored cluster, at the cost of one job start.
    No test depends on running before or after the one that kills a node. After it, Ray
    still lists the lost node (state DEAD, same IP, its old node id) next to the new one:
    a test that maps IPs to node ids takes the alive ones.
    """

    def __init__(self, cluster: RayCluster) -> None:
        self.cluster = cluster
        self.job: RayGlooJob | None = None
        self.spoiled = False
        self.starts = 0

    def current(self) -> RayGlooJob:
        job = self.job
        if job is None or self.spoiled or job.driver.poll() is not None:
            self.stop()
            self.job = self._start()
            self.spoiled = False
        return self.job

    def spoil(self) -> None:
        self.spoiled = True

    def _start(self) -> RayGlooJob:
        cluster = self.cluster
        self.starts += 1
        state = Path(tempfile.mkdtemp(prefix="ray-gloo-", dir=cluster.base))
        argv = [sys.executable, str(RAY_GLOO), cluster.address, "cleanup_deadlock", str(state)]
        with (cluster.base / "ray_gloo.log").open("ab") as log:
            driver = subprocess.Popen(
                [*argv, str(free_port()), str(REPO), str(RAY_NODES)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=cluster.env(),
            )
        world = 2 * RAY_NODES

        def ready() -> bool:
            if driver.poll() is not None:
                raise RuntimeError(f"the Ray gloo driver exited {driver.returncode}")
            return len(list(state.glob("rank*.ready"))) == world

        try:
            wait_for(ready, 120, "every Ray gloo rank to hang", interval=0.2)
        except BaseException:
            driver.kill()
            driver.wait(timeout=30)
            raise
        return RayGlooJob(driver, state, world)

    def stop(self) -> None:
        """End the driver and wait until Ray has ended its ranks (they hold every CPU)."""
        job, self.job = self.job, None
        if job is None:
            return
        job.driver.terminate()
        job.driver.wait(timeout=30)
        wait_for(lambda: not self._ranks_alive(), 60, "the Ray gloo ranks to end", interval=0.2)

    def _ranks_alive(self) -> bool:
        from ray.util.state import list_actors

        alive = list_actors(
            address=self.cluster.address,
            filters=[("state", "=", "ALIVE"), ("class_name", "=", "RankWorker")],
            raise_on_missing_output=False,
        )
        return bool(alive)


@pytest.fixture(scope="session")
def ray_gloo_jobs(ray_cluster: RayCluster) -> Iterator[RayGlooJobs]:
    jobs = RayGlooJobs(ray_cluster)
    try:
        yield jobs
    finally:
        job = jobs.job
        if job is not None:
            job.driver.terminate()
            job.driver.wait(timeout=30)


@pytest.fixture
def ray_gloo_job(ray_gloo_jobs: RayGlooJobs) -> RayGlooJob:
    """Four gloo ranks as Ray actors, two per node, hung in a cleanup deadlock (rank 3
    failed and waits in the cleanup barrier; ranks 0-2 wait in the gradient all_reduce).
    One job for the session, started again only after a test spoiled it (`RayGlooJobs`)."""
    return ray_gloo_jobs.current()
