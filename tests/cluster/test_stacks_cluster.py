"""Stacks across the real sshd test cluster: one hung gloo job spanning four nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fixtures.hang import rank_script

cluster_lib = pytest.importorskip(
    "tests.support.cluster", reason="needs the sshd test cluster helpers"
)
GlooJob = cluster_lib.GlooJob
TestCluster = cluster_lib.TestCluster
free_port = cluster_lib.free_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RANKS_PER_NODE = 2
MARKER = f"stacks-cluster-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def job(cluster: TestCluster) -> Iterator[GlooJob]:
    for node in cluster.nodes:
        if not node.running:
            node.start()
    script = rank_script("cleanup_deadlock", MARKER, str(REPO))
    with cluster.start_gloo_job(
        ranks_per_node=RANKS_PER_NODE, script=script, timeout=180
    ) as running:
        yield running


def run_stacks(cluster: TestCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = cluster.env()
    env["PYTHONPATH"] = f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}"
    return subprocess.run(
        [sys.executable, "-m", "areal_console", "stacks", "--match", MARKER, "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def test_cleanup_deadlock_across_nodes(cluster: TestCluster, job: GlooJob) -> None:
    last = world = job.world_size
    result = run_stacks(cluster, "--hosts", cluster.hosts_arg())
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["errors"] == []
    ranks = sorted((r["rank"], r["node"]) for r in doc["ranks"] if r["rank"] is not None)
    assert ranks == sorted((p.rank, p.node.name) for p in job.placements)
    assert [(g["label"], len(g["ranks"])) for g in doc["groups"]] == [
        (f"0-{world - 2}", world - 1),
        (str(last - 1), 1),
    ]
    assert doc["diagnosis"]["pattern"] == "cleanup_deadlock"
    assert any(e.startswith(f"rank {last - 1} ") for e in doc["diagnosis"]["evidence"])


def test_unreachable_node_is_partial(cluster: TestCluster, job: GlooJob, tmp_path: Path) -> None:
    inventory = tmp_path / "cluster.yaml"
    nodes = "".join(f"  - {n.name}\n" for n in cluster.nodes)
    inventory.write_text(
        f"nodes:\n{nodes}  - name: dead\n    host: '127.0.0.9'\n"
        f"    port: {free_port('127.0.0.9')}\n"
    )
    result = run_stacks(cluster, "--inventory", str(inventory))
    assert result.returncode == 3, result.stderr
    doc = json.loads(result.stdout)
    assert [e["node"] for e in doc["errors"]] == ["dead"]
    assert doc["diagnosis"]["pattern"] == "cleanup_deadlock"  # the rest still diagnosed
    assert "warning: dead:" in result.stderr


def config_refused_at(cluster: TestCluster, refusing: str, tmp_path: Path) -> Path:
    """The cluster's ssh_config with node `refusing` offered a key it does not accept."""
    stranger = tmp_path / "stranger"
    cluster_lib._keygen(stranger, "not-authorized")
    blocks = cluster.ssh_config.read_text().split("Host ")
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host ".join(
            b.replace(str(cluster.identity), str(stranger)) if b.startswith(refusing) else b
            for b in blocks
        )
    )
    return config


def test_frozen_and_refusing_nodes_leave_the_capture_on_time_with_coverage(
    cluster: TestCluster, job: GlooJob, tmp_path: Path
) -> None:
    """One node's sshd frozen (SIGSTOP: it accepts, never answers), one refusing our key:
    the capture returns at the node deadline, not the 60 s connect timeout, and states
    its coverage in JSON, in the text report and on stderr."""
    frozen, refusing = cluster.nodes[1], cluster.nodes[2]
    config = config_refused_at(cluster, refusing.name, tmp_path)
    sshd = frozen.init_pid
    assert sshd is not None
    os.kill(sshd, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        result = run_stacks(
            cluster, "--hosts", cluster.hosts_arg(), "--ssh-config", str(config),
            "--node-timeout", "5", "--connect-timeout", "600", "--save", str(tmp_path / "out"),
        )  # fmt: skip
        elapsed = time.monotonic() - t0
    finally:
        os.kill(sshd, signal.SIGCONT)
    assert result.returncode == 3, result.stderr
    # The 5 s deadline (plus start-up, about 10 s in all), 10x bounded; the connect
    # timeout (600 s) would end in run_stacks' 180 s timeout.
    assert elapsed < 100, elapsed
    doc = json.loads(result.stdout)
    captured = RANKS_PER_NODE * (len(cluster.nodes) - 2)
    assert doc["coverage"] == {
        "ranks_captured": captured,
        "ranks_expected": job.world_size,
        "nodes_failed": [
            {"node": frozen.name, "reason": "timeout 5 s"},
            {"node": refusing.name, "reason": "authentication"},
        ],
    }
    line = (
        f"{captured} of {job.world_size} ranks; 2 nodes failed: "
        f"{frozen.name} (timeout 5 s), {refusing.name} (authentication)"
    )
    assert f"warning: coverage: {line}" in result.stderr
    text = (tmp_path / "out" / f"{doc['id']}.txt").read_text()
    assert f"Coverage: {line}" in text.splitlines()


def test_a_fanout_tree_captures_every_rank_through_two_connections(
    cluster: TestCluster, job: GlooJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--fanout-tree 2` on 4 nodes: the console opens SSH to node1 and node2 only; their
    agents start node3's and node4's over ssh (the nodes' OpenSSH, the cluster's ssh config
    as the node-to-node config). The capture is the flat one: every rank, one diagnosis."""
    from areal_console.core.connection import ssh
    from areal_console.core.stacks.capture import CaptureOptions, take_capture

    opened: list[str] = []
    real_open = ssh.open_ssh_channel

    def counting_open(spec: object, **options: object) -> object:
        opened.append(spec.name)  # type: ignore[attr-defined]
        return real_open(spec, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(ssh, "open_ssh_channel", counting_open)
    fleet = cluster.fleet(fanout_tree=2, tree_ssh_config=str(cluster.ssh_config))
    try:
        capture = take_capture(fleet, CaptureOptions(match=MARKER), save=False)
        relays = {s.name: s.relay_parent.name if s.relay_parent else None for s in fleet}
        hosts = {s.name: s.hello.get("hostname") for s in fleet}
    finally:
        fleet.close()
    assert sorted(opened) == ["node1", "node2"]
    assert relays == {"node1": None, "node2": None, "node3": "node1", "node4": "node2"}
    assert hosts == {n.name: n.name for n in cluster.nodes}  # each agent on its own node
    assert capture.errors == []
    got = sorted((r.rank, r.node) for r in capture.rank_stacks if r.state == "ok")
    assert got == sorted((p.rank, p.node.name) for p in job.placements)

    # The same from the command line, as JSON: the diagnosis the flat capture gives.
    result = run_stacks(
        cluster, "--hosts", cluster.hosts_arg(), "--fanout-tree", "2",
        "--tree-ssh-config", str(cluster.ssh_config),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["errors"] == [] and doc["diagnosis"]["pattern"] == "cleanup_deadlock"
    assert doc["coverage"]["ranks_captured"] == job.world_size

    # `nodes` through the same tree names each node's relay.
    env = cluster.env()
    env["PYTHONPATH"] = f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}"
    nodes = subprocess.run(
        [sys.executable, "-m", "areal_console", "nodes", "--hosts", cluster.hosts_arg(),
         "--fanout-tree", "2", "--tree-ssh-config", str(cluster.ssh_config), "--json"],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    assert nodes.returncode == 0, nodes.stderr
    listed = {
        n["name"]: (n["state"], n["via"], n["relay"]) for n in json.loads(nodes.stdout)["nodes"]
    }
    assert listed == {
        "node1": ("up", "ssh", None),
        "node2": ("up", "ssh", None),
        "node3": ("up", "ssh", "node1"),
        "node4": ("up", "ssh", "node2"),
    }


def test_frozen_and_refusing_nodes_under_relays_are_named_with_their_reasons(
    cluster: TestCluster, job: GlooJob, tmp_path: Path
) -> None:
    """The tree's faults are the flat one's: node3 (under node1) has its sshd frozen, node4
    (under node2) refuses the key the node-to-node ssh offers. The capture returns at the
    node deadline with both named, and node1's and node2's ranks captured."""
    frozen, refusing = cluster.nodes[2], cluster.nodes[3]
    config = config_refused_at(cluster, refusing.name, tmp_path)
    sshd = frozen.init_pid
    assert sshd is not None
    os.kill(sshd, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        result = run_stacks(
            cluster, "--hosts", cluster.hosts_arg(), "--fanout-tree", "2",
            "--tree-ssh-config", str(config), "--node-timeout", "5", "--connect-timeout", "600",
        )  # fmt: skip
        elapsed = time.monotonic() - t0
    finally:
        os.kill(sshd, signal.SIGCONT)
    assert result.returncode == 3, result.stderr
    # The 5 s deadline (plus start-up and the relays' own ssh), 10x bounded; the connect
    # timeout (600 s) would end in run_stacks' 180 s timeout.
    assert elapsed < 100, elapsed
    doc = json.loads(result.stdout)
    captured = RANKS_PER_NODE * 2
    assert doc["coverage"] == {
        "ranks_captured": captured,
        "ranks_expected": job.world_size,
        "nodes_failed": [
            {"node": frozen.name, "reason": "timeout 5 s"},
            {"node": refusing.name, "reason": "authentication"},
        ],
    }
    errors = {e["node"]: e["error"] for e in doc["errors"]}
    assert "relayed by node2" in errors[refusing.name]
    assert "Permission denied (publickey" in errors[refusing.name]


def test_report_across_nodes_reads_versions_through_each_agent(
    cluster: TestCluster, job: GlooJob, tmp_path: Path
) -> None:
    import platform
    import tarfile

    env = cluster.env()
    env["PYTHONPATH"] = f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}"
    out = tmp_path / "bug.md"
    result = subprocess.run(
        [sys.executable, "-m", "areal_console", "report", "--hosts", cluster.hosts_arg(),
         "--match", MARKER, "-o", str(out)],
        capture_output=True, text=True, env=env, timeout=240, check=False,
    )  # fmt: skip
    # The job's command lines name no AReaL log directory: logs, config and metrics are
    # named as not collected (exit 3); everything else came from the four nodes.
    assert result.returncode == 3, result.stderr
    assert "warning: not collected: logs, config, metrics: the log directory is not known" in (
        result.stderr
    )
    assert "versions" not in result.stderr
    md = out.read_text()
    last = job.world_size - 1
    assert f"Everyone waits on rank {last} (in " in md and "(`cleanup_deadlock`)" in md
    names = ", ".join(n.name for n in cluster.nodes)
    assert f"All {len(cluster.nodes)} nodes ({names}) agree:" in md
    assert f"- Python {platform.python_version()} (" in md
    with tarfile.open(tmp_path / "bug.tar.gz") as tar:
        member = tar.extractfile("report/versions.json")
        assert member is not None
        versions = json.loads(member.read())
    assert sorted(v["node"] for v in versions) == sorted(n.name for n in cluster.nodes)
    for v in versions:  # each node's agent read its own ranks' interpreters (the `load`ed op)
        ok = [i for i in v["interpreters"] if "error" not in i]
        assert len(ok) == RANKS_PER_NODE, v
        assert all(i["python"] == platform.python_version() for i in ok)
