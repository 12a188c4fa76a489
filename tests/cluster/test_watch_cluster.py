"""`areal-console watch` over real sshd nodes: a node that drops and comes back is said
so on stderr and watched again; the job's episode goes on (no `gone`)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from conftest import cli_env

from tests.support.cluster import TestCluster
from tests.support.watch_cli import watching

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_node_that_drops_and_comes_back_is_reconnected(
    live_cluster: TestCluster, tmp_path: Path
) -> None:
    ranks, victim = live_cluster.nodes[:2], live_cluster.nodes[3]
    job = live_cluster.start_gloo_job(ranks_per_node=1, nodes=ranks)
    try:
        with watching("--hosts", live_cluster.hosts_arg(), "--stall-after", "2", "--interval",
                      "0.5", "--evidence", str(tmp_path / "ev"), "--json",
                      env=live_cluster.env(cli_env())) as watch:  # fmt: skip
            # No log names this job: its stacks, unchanged across samples, are the stall.
            stall = watch.event("stall")
            assert "stacks unchanged" in str(stall["detail"])
            folder = Path(str(watch.event("evidence")["evidence"]))
            # Written by the watch's child process, over its own SSH connections.
            ranks = json.loads((folder / "stacks.json").read_text())["ranks"]
            assert sorted(r["rank"] for r in ranks if r.get("rank") is not None) == [0, 1]
            assert "evidence" not in json.loads((folder / "watch.json").read_text())["missing"]
            victim.stop()
            assert "reconnecting" in watch.said(f"{victim.name}: unreachable")
            victim.start()
            watch.said(f"{victim.name}: reconnected")
            assert watch.stop(signal.SIGTERM) == 0
            assert [e["event"] for e in watch.events()] == ["stall", "evidence"]
    finally:
        job.stop()
        if not victim.running:
            victim.start()
