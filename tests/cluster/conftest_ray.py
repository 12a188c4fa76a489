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


@pytest.fixture(scope="session")
def ray_gloo_job(ray_cluster: RayCluster) -> Iterator[RayGlooJob]:
    """Four gloo ranks as Ray actors, two per node, hung in a cleanup deadlock (rank 3
    failed and waits in the cleanup barrier; ranks 0-2 wait in the gradient all_reduce)."""
    state = Path(tempfile.mkdtemp(prefix="ray-gloo-", dir=ray_cluster.base))
    log = (ray_cluster.base / "ray_gloo.log").open("wb")
    argv = [sys.executable, str(RAY_GLOO), ray_cluster.address, "cleanup_deadlock", str(state)]
    driver = subprocess.Popen(
        [*argv, str(free_port()), str(REPO), str(RAY_NODES)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=ray_cluster.env(),
    )
    world = 2 * RAY_NODES

    def ready() -> bool:
        if driver.poll() is not None:
            raise RuntimeError(f"the Ray gloo driver exited {driver.returncode}")
        return len(list(state.glob("rank*.ready"))) == world

    try:
        wait_for(ready, 120, "every Ray gloo rank to hang", interval=0.2)
        yield RayGlooJob(driver, state, world)
    finally:
        driver.terminate()
        driver.wait(timeout=30)
        log.close()
