"""The fan-out tree: its shape, and real agents relaying for real agents on this machine.

The relayed hop here starts the child's agent as a local process (the same bootstrap, the
payload from the relay's own file); over SSH it is `ssh NODE ...` instead, tested with real
sshd nodes in tests/cluster/test_stacks_cluster.py.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

import pytest
from areal_console.core.connection.fleet import Fleet, NodeFailure
from areal_console.core.connection.relay import plan_tree, ssh_relay_argv
from areal_console.core.connection.transport import bootstrap_argv
from areal_console.core.stacks.coverage import short_reason
from areal_console.core.targets.options import TargetOptions
from areal_console.core.targets.specs import NodeSpec

from tests.support.waits import wait_for


def depth(parents: dict[str, str | None], name: str) -> int:
    d = 0
    while parents[name] is not None:
        name = parents[name]  # type: ignore[assignment]
        d += 1
    return d


def test_512_nodes_at_fanout_32_are_32_relays_of_15() -> None:
    names = [f"n{i:03d}" for i in range(512)]
    parents = plan_tree(names, 32)
    roots = [n for n in names if parents[n] is None]
    assert roots == names[:32]
    children: dict[str, list[str]] = {}
    for name, parent in parents.items():
        if parent is not None:
            children.setdefault(parent, []).append(name)
    assert sorted(len(c) for c in children.values()) == [15] * 32
    assert max(depth(parents, n) for n in names) == 1


@pytest.mark.parametrize(("n", "k"), [(1, 2), (2, 2), (7, 2), (100, 3), (1000, 8)])
def test_every_node_is_placed_once_and_no_relay_has_more_than_k(n: int, k: int) -> None:
    names = [f"n{i}" for i in range(n)]
    parents = plan_tree(names, k)
    assert list(parents) != [] and sorted(parents) == sorted(names)
    counts: dict[str | None, int] = {}
    for parent in parents.values():
        counts[parent] = counts.get(parent, 0) + 1
    assert max(counts.values()) <= k
    assert counts[None] == min(n, k)
    for name in names:
        depth(parents, name)  # ends at the console: no cycle


def test_the_ssh_hop_is_an_argv_in_batch_mode_never_a_shell_string_of_ours() -> None:
    spec = NodeSpec(name="n7", transport="ssh", host="10.0.0.7", port=2222, user="alice")
    argv = ssh_relay_argv(spec, "/shared/ssh_config", 5.0)
    assert argv[:6] == ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    assert argv[6:12] == ["-F", "/shared/ssh_config", "-p", "2222", "-l", "alice"]
    assert argv[12:14] == ["--", "10.0.0.7"]
    assert argv[14].startswith("/bin/sh -c ")  # the remote command: one quoted line
    assert len(argv) == 15


def test_target_options_carry_the_tree_to_the_fleet() -> None:
    options = TargetOptions.of({"fanout_tree": 32, "tree_ssh_config": "/etc/ssh/tree"})
    fleet_options = options.fleet_options()
    assert (fleet_options["fanout_tree"], fleet_options["tree_ssh_config"]) == (32, "/etc/ssh/tree")
    assert "fanout_tree" not in TargetOptions().fleet_options()  # off by default


def local_agent(spec: NodeSpec) -> list[str]:
    return bootstrap_argv(sys.executable)


@pytest.fixture
def tree() -> Iterator[Fleet]:
    """7 local nodes, fan-out 2: n0 and n1 connected; n2-n6 started by relays (n4 two deep)."""
    specs = [NodeSpec(name=f"n{i}", transport="local") for i in range(7)]
    fleet = Fleet(specs, fanout_tree=2, relay_argv=local_agent, probe_gpus=False)
    try:
        yield fleet
    finally:
        fleet.close()


def test_relayed_agents_answer_as_flat_ones_do(tree: Fleet) -> None:
    results = tree.call_all("ping")
    assert not [r for r in results.values() if isinstance(r, NodeFailure)], results
    pids = {s.name: s.hello["pid"] for s in tree}
    assert len(set(pids.values())) == 7  # seven agents, one per node
    parents = {s.name: s.relay_parent.name if s.relay_parent else None for s in tree}
    assert parents == {"n0": None, "n1": None, "n2": "n0", "n3": "n0", "n4": "n2",
                       "n5": "n1", "n6": "n1"}  # fmt: skip
    samples = tree.call_all("sample", {"cpu": False, "gpus": False})
    assert all("processes" in s for s in samples.values())


def test_a_frozen_relayed_agent_is_overdue_alone(tree: Fleet) -> None:
    tree.call_all("ping")
    frozen = tree.session("n4").hello["pid"]  # two relays deep
    os.kill(frozen, signal.SIGSTOP)
    try:
        results = tree.fan_out(lambda s: s.call("ping", timeout=30), node_timeout=1.0)
    finally:
        os.kill(frozen, signal.SIGCONT)
    failed = {n: r for n, r in results.items() if isinstance(r, NodeFailure)}
    assert list(failed) == ["n4"]
    assert short_reason(failed["n4"].error) == "timeout 1 s"


def test_a_dead_relay_takes_its_subtree_down_by_name(tree: Fleet) -> None:
    tree.call_all("ping")
    n2, n4 = tree.session("n2"), tree.session("n4")
    os.kill(n2.hello["pid"], signal.SIGKILL)  # n2 relays for n4
    wait_for(lambda: n2.state == "down" and n4.state == "down", 20, "n2 and n4 to go down")
    assert "killed by signal 9" in (n2.error or ""), n2.error
    assert (n4.error or "").startswith("relay n2 is down: "), n4.error
    assert all(tree.session(n).state == "up" for n in ("n0", "n1", "n3", "n5", "n6"))
    # The next request brings the relay back, and the node under it with it.
    again = tree.call_all("ping", timeout=10)
    assert not [r for r in again.values() if isinstance(r, NodeFailure)], again
    assert n4.relay_parent is n2 and n4.hello["pid"] != n2.hello["pid"]


def test_a_relayed_node_closed_and_connected_again_keeps_its_new_connection(tree: Fleet) -> None:
    """The old child's end must not reach the new one's channel (same name, same relay)."""
    tree.call_all("ping")
    n4 = tree.session("n4")
    pids = {n4.hello["pid"]}
    for _ in range(3):
        n4.close()
        n4.connect(timeout=20, force=True)
        pids.add(n4.hello["pid"])
        assert n4.ping(timeout=10) >= 0
    assert len(pids) == 4  # a new agent each time
    assert n4.state == "up"


def test_the_tuis_monitor_streams_samples_from_relayed_nodes(tree: Fleet) -> None:
    """The Cluster screen's data: every node's 1 Hz sample stream, relayed ones included."""
    from areal_console.core.connection.monitor import FleetMonitor

    monitor = FleetMonitor(tree, interval=0.2)
    monitor.start()
    try:
        wait_for(
            lambda: all(v.state == "up" and v.sample for v in monitor.snapshot()),
            30,
            "a sample from every node",
        )
        views = {v.name: v for v in monitor.snapshot()}
    finally:
        monitor.stop()
    assert sorted(views) == [f"n{i}" for i in range(7)]
    assert {v.hello.get("pid") for v in views.values()} == {s.hello["pid"] for s in tree}
    # The Nodes pane says which relay carries a node.
    from areal_console.widgets.node_table import node_cells

    relays = {s.name: s.relay_parent.name if s.relay_parent else None for s in tree}
    assert {n: v.relay for n, v in views.items()} == relays and any(relays.values())
    for name, relay in relays.items():
        detail = str(node_cells(views[name])["detail"])
        assert detail.endswith(f" · via {relay}") if relay else " · via " not in detail, detail


def test_a_child_that_cannot_start_is_named_with_its_reason() -> None:
    def argv(spec: NodeSpec) -> list[str]:
        if spec.name == "n3":
            return ["/nonexistent/python3", "-c", "pass"]
        if spec.name == "n2":  # the bootstrap's own refusal, as an old Python says it
            script = (
                "import sys; sys.stderr.write('areal-agent: python-too-old 3.8.10 3.9 n2 "
                "/usr/bin/python3\\n'); sys.exit(86)"
            )
            return [sys.executable, "-c", script]
        return bootstrap_argv(sys.executable)

    specs = [NodeSpec(name=f"n{i}", transport="local") for i in range(4)]
    fleet = Fleet(specs, fanout_tree=2, relay_argv=argv, probe_gpus=False)
    try:
        results = fleet.connect_all(timeout=20)
    finally:
        fleet.close()
    assert not isinstance(results["n0"], NodeFailure) and not isinstance(results["n1"], NodeFailure)
    n2, n3 = results["n2"], results["n3"]
    assert isinstance(n2, NodeFailure) and isinstance(n3, NodeFailure)
    assert n2.error.startswith("/usr/bin/python3 on n2 is 3.8.10"), n2.error
    assert "relay n1 could not start n3's agent" in n3.error
    assert "/nonexistent/python3" in n3.error
