"""A real multi-node gloo job over SSH, seen through the fleet and `areal-console nodes`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.connection.fleet import Fleet, NodeFailure

from tests.support import waits
from tests.support.cluster import GlooJob, TestCluster, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB_NODES = 3
RANKS_PER_NODE = 2


@pytest.fixture(scope="module")
def job(cluster: TestCluster) -> Iterator[GlooJob]:
    """Six ranks on node1-node3 (node4 runs none), blocked in a barrier / a sleep."""
    for node in cluster.nodes:
        if not node.running:
            node.start()
    with cluster.start_gloo_job(
        ranks_per_node=RANKS_PER_NODE, nodes=cluster.nodes[:JOB_NODES]
    ) as running:
        yield running


def run_cli(cluster: TestCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = cluster.env()
    env["PYTHONPATH"] = f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}"
    return subprocess.run(
        [sys.executable, "-m", "areal_console", "nodes", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def ranks_seen(processes: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    return sorted((p["rank"], p["local_rank"], p["world_size"]) for p in processes)


def expected_ranks(job: GlooJob, node: str) -> list[tuple[int, int, int]]:
    return [(p.rank, p.local_rank, job.world_size) for p in job.placements if p.node.name == node]


def test_every_node_reports_exactly_its_own_ranks(cluster: TestCluster, job: GlooJob) -> None:
    fleet = Fleet(cluster.specs(), **cluster.ssh_options())
    try:
        results = fleet.call_all("sample")
    finally:
        fleet.close()
    assert job.world_size == JOB_NODES * RANKS_PER_NODE
    for node in cluster.nodes:
        sample = results[node.name]
        assert not isinstance(sample, NodeFailure), sample
        assert sample["hostname"] == node.name
        assert ranks_seen(sample["processes"]) == expected_ranks(job, node.name)
        for proc in sample["processes"]:
            assert proc["master_addr"] == "127.0.0.2"
            assert "python3" in proc["cmdline"]
    assert results["node4"]["processes"] == []
    assert job.ranks_on("node2") == [2, 3]


def test_nodes_json_over_ssh(cluster: TestCluster, job: GlooJob) -> None:
    proc = run_cli(cluster, "--hosts", cluster.hosts_arg(), "--json")
    assert proc.returncode == 0, proc.stderr
    nodes = json.loads(proc.stdout)["nodes"]
    assert [n["name"] for n in nodes] == ["node1", "node2", "node3", "node4"]
    for n in nodes:
        assert (n["state"], n["error"], n["hostname"]) == ("up", None, n["name"])
        assert n["gpus"] == [] and n["gpu_error"]  # no NVML here: reported, not fatal
        assert ranks_seen(n["processes"]) == expected_ranks(job, n["name"])
        assert n["latency_ms"] is not None and n["latency_ms"] > 0


def test_nodes_partial_failure_still_prints_the_rest(
    cluster: TestCluster, job: GlooJob, tmp_path: Path
) -> None:
    dead = f"127.0.0.9:{free_port('127.0.0.9')}"
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(
        "nodes:\n"
        "  - node1\n"
        "  - node2\n"
        f"  - name: dead\n    host: '{dead.split(':')[0]}'\n    port: {dead.split(':')[1]}\n"
        "groups:\n  some: [node2, dead]\n"
    )
    proc = run_cli(cluster, "--inventory", str(inventory), "--group", "some", "--json")
    assert proc.returncode == 3, proc.stderr
    nodes = {n["name"]: n for n in json.loads(proc.stdout)["nodes"]}
    assert list(nodes) == ["node2", "dead"]
    assert ranks_seen(nodes["node2"]["processes"]) == expected_ranks(job, "node2")
    assert nodes["dead"]["state"] == "down"
    assert nodes["dead"]["error"].startswith(f"connection refused by {dead}")
    assert proc.stderr.strip() == f"warning: dead: {nodes['dead']['error']}"

    table = run_cli(cluster, "--hosts", f"node1,{dead}")
    assert table.returncode == 3
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "NODE",
        "STATE",
        "HOST",
        "VIA",
        "LATENCY",
        "GPUS",
        "RANKS",
        "PROCS",
        "NOTE",
    ]
    assert lines[1].split()[:2] == ["node1", "up"] and " 0-1 " in lines[1]
    assert lines[1].split()[3] == "ssh"  # VIA: how the agent was reached
    assert lines[2].split()[:2] == ["127.0.0.9", "down"] and "connection refused" in lines[2]


def test_nodes_unknown_host_needs_accept_new_hosts(cluster: TestCluster, tmp_path: Path) -> None:
    node = cluster.nodes[3]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host fresh\n    HostName {node.address}\n    Port {node.port}\n    User root\n"
        f"    IdentityFile {cluster.identity}\n"
    )
    data = Path(os.environ["AREAL_CONSOLE_DATA_DIR"])  # per test (conftest)
    base = ["--hosts", "fresh", "--ssh-config", str(config), "--json"]
    refused = run_cli(cluster, *base)
    assert refused.returncode == 1
    record = json.loads(refused.stdout)["nodes"][0]
    assert record["host_key"]["type"] == "ssh-ed25519"
    assert record["host_key"]["fingerprint"].startswith("SHA256:")
    assert record["host_key"]["fingerprint"] in refused.stderr
    assert "--accept-new-hosts" in refused.stderr
    accepted = run_cli(cluster, *base, "--accept-new-hosts")
    assert accepted.returncode == 0, accepted.stderr
    assert (data / "known_hosts").read_text().startswith(f"[{node.address}]:{node.port} ")
    assert run_cli(cluster, *base).returncode == 0  # remembered


async def _until(condition: Any, timeout: float = 60.0, what: str = "") -> None:
    await waits.until(None, condition, timeout, what or "condition")


async def test_cluster_screen_over_ssh_confirms_an_unknown_host_key(
    cluster: TestCluster, job: GlooJob, tmp_path: Path
) -> None:
    """The Cluster screen on real nodes: node2 is known; node3's key is new, so its
    fingerprint is shown and trusting it brings the node and its ranks up."""
    from areal_console.app import ConsoleApp
    from areal_console.core.targets.resolve import NodeSpec
    from areal_console.dialogs.host_key import HostKeyScreen
    from areal_console.screens.cluster import ClusterScreen
    from areal_console.widgets.node_table import NodeTable
    from areal_console.widgets.process_table import ProcessTable

    known, fresh = cluster.nodes[1], cluster.nodes[2]
    config = tmp_path / "ssh_config"
    config.write_text(
        cluster.ssh_config.read_text()
        + f"\nHost fresh\n    HostName {fresh.address}\n    Port {fresh.port}\n    User root\n"
        f"    IdentityFile {cluster.identity}\n"
    )
    specs = [known.spec(), NodeSpec(name="fresh", transport="ssh", host="fresh")]
    fleet = Fleet(specs, ssh_config=str(config), allow_agent=False)
    app = ConsoleApp(fleet, refresh_interval=0.3)
    async with app.run_test(size=(150, 40)) as pilot:
        await _until(lambda: isinstance(app.screen, HostKeyScreen), what="the host key question")
        screen = app.screen_stack[-2]
        assert isinstance(screen, ClusterScreen)
        nodes = screen.query_one(NodeTable)
        question = app.screen
        assert isinstance(question, HostKeyScreen)
        assert question.node == "fresh" and question.key.startswith("ssh-ed25519 SHA256:")
        assert str(nodes.get_cell("fresh", "state")) == "down"
        await pilot.press("y")
        await _until(lambda: str(nodes.get_cell("fresh", "state")) == "up", what="fresh up")
        await _until(lambda: str(nodes.get_cell(known.name, "state")) == "up", what="node2 up")
        table = screen.query_one(ProcessTable)

        def ranks_on(node: str) -> list[int]:
            return sorted(
                int(str(table.get_cell(k, "rank")).split("/")[0])
                for k in table.rows
                if (k.value or "").startswith(node + ":") and str(table.get_cell(k, "rank")) != "-"
            )

        await _until(lambda: ranks_on("fresh") == job.ranks_on(fresh), what="ranks on fresh")
        assert ranks_on(known.name) == job.ranks_on(known)
        assert str(nodes.get_cell("fresh", "ranks")) == str(RANKS_PER_NODE)
        assert str(nodes.get_cell("fresh", "latency")).endswith(" ms")
        # Enter drills into the highlighted node: only its processes remain.
        nodes.focus()
        await pilot.press("enter")
        drilled = screen.drilled
        assert drilled in ("fresh", known.name)
        await _until(lambda: all((k.value or "").startswith(drilled + ":") for k in table.rows),
                     what="drill-in")  # fmt: skip
