"""Shared fixtures: an isolated console data dir, and the real sshd test cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import TestCluster, skip_reason

CLUSTER_NODES = 4


@pytest.fixture(autouse=True)
def _isolated_console_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console never writes to the real $HOME in tests."""
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AREAL_CONSOLE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("AREAL_CONSOLE_SSH_CONFIG", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """Four real sshd nodes (127.0.0.2-5), each in its own PID/UTS/mount namespace."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("cluster")
    test_cluster = TestCluster(root, nodes=CLUSTER_NODES)
    try:
        test_cluster.start()
        yield test_cluster
    finally:
        test_cluster.stop()


@pytest.fixture
def live_cluster(cluster: TestCluster) -> TestCluster:
    """The session cluster with every node running (a test before may have stopped one)."""
    for node in cluster.nodes:
        if not node.running:
            node.start()
    return cluster


def pytest_report_header() -> str:
    return f"sshd test cluster: {skip_reason() or 'available'} (pid {os.getpid()})"
