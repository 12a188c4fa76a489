"""Faults on real nodes: sshd killed mid-session and restarted, the agent killed on a node."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from areal_console.core.connection.client import AgentDisconnected
from areal_console.core.connection.fleet import Backoff, Fleet, NodeFailure, NodeSession
from areal_console.core.connection.monitor import FleetMonitor, NodeView

from tests.support.cluster import TestCluster, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FAST_BACKOFF = Backoff(initial=0.2, factor=2.0, maximum=1.0, jitter=0.0)


class StateLog:
    """Collects `state` events per node, thread-safely."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: dict[str, list[tuple[str, str | None]]] = {}

    def __call__(self, session: NodeSession, message: dict[str, Any]) -> None:
        if message.get("event") == "state":
            with self.lock:
                self.states.setdefault(session.name, []).append(
                    (message["state"], message["error"])
                )

    def of(self, name: str) -> list[str]:
        with self.lock:
            return [s for s, _ in self.states.get(name, [])]


def test_sshd_killed_then_back(live_cluster: TestCluster) -> None:
    """The monitor (the console's one reconnect engine) brings a node back by itself."""
    victim = live_cluster.nodes[3]
    fleet = Fleet(live_cluster.specs(), backoff=FAST_BACKOFF, **live_cluster.ssh_options())
    monitor = FleetMonitor(fleet, interval=0.5)
    log = StateLog()
    session = fleet.session(victim.name)

    def view() -> NodeView:
        return next(v for v in monitor.snapshot() if v.name == victim.name)

    try:
        monitor.start()
        wait_for(lambda: all(v.state == "up" for v in monitor.snapshot()), 60, "every node up")
        first_client = session.client
        observed = session.on_event
        assert observed is not None

        def tee(s: NodeSession, message: dict[str, Any]) -> None:
            log(s, message)
            observed(s, message)

        session.on_event = tee  # the monitor's handler, and a record of the states

        victim.stop()  # kills sshd and, with its namespace, the agent
        wait_for(lambda: view().state == "down", 15, "the node to go down")
        assert view().error == f"SSH connection to {victim.name} lost"
        # While it is away: other nodes answer, and this one fails fast with a reason.
        t0 = time.monotonic()
        results = fleet.call_all("ping", timeout=30)
        assert time.monotonic() - t0 < 3  # at once, not at the 30 s timeout
        assert isinstance(results[victim.name], NodeFailure)
        assert all(not isinstance(results[n.name], NodeFailure) for n in live_cluster.nodes[:3])
        wait_for(
            lambda: (view().error or "").startswith("connection refused"),
            15,
            "a reconnect attempt to be refused",
        )
        status = session.status()
        assert status.state == "down" and status.retry_in is not None

        victim.start()
        wait_for(lambda: view().state == "up", 20, "the node to come back by itself")
        assert session.call("sample")["hostname"] == victim.name
        assert session.client is not first_client and session.client is not None
        states = log.of(victim.name)
        assert states[0] == "down" and "connecting" in states and states[-1] == "up"
        assert session.failures == 0 and session.latency is not None
    finally:
        monitor.stop()
        fleet.close()
        if not victim.running:
            victim.start()


def test_killed_agent_is_restarted_on_next_call(live_cluster: TestCluster) -> None:
    node = live_cluster.nodes[2]
    session = NodeSession(node.spec(), **live_cluster.ssh_options())
    try:
        pid = session.connect()["pid"]
        killed = node.run(f"kill -9 {pid}")  # same PID namespace as the agent
        assert killed.returncode == 0, killed.stderr
        wait_for(lambda: session.state == "down", 10, "the agent's end to be noticed")
        assert session.error == f"agent on {node.name} was killed"
        assert session.client is not None
        with pytest.raises(AgentDisconnected, match="was killed"):
            session.client.request("ping")  # the old link is gone for good
        assert session.call("sample")["hostname"] == node.name  # reconnects first
        assert session.state == "up"
        assert session.hello["pid"] != pid
    finally:
        session.close()


def test_unreachable_node_does_not_hold_up_the_others(live_cluster: TestCluster) -> None:
    specs = [*live_cluster.specs()[:2], live_cluster.nodes[0].spec(name="bad", port=1)]
    fleet = Fleet(specs, **live_cluster.ssh_options())
    try:
        results = fleet.connect_all()
        assert results["node1"]["hostname"] == "node1"
        assert results["node2"]["hostname"] == "node2"
        failure = results["bad"]
        assert isinstance(failure, NodeFailure)
        assert failure.error.startswith("connection refused by 127.0.0.2:1")
        # In backoff: the next call fails with the same reason and makes no new attempt
        # (the count of failed connects stays at one).
        bad = fleet.session("bad")
        assert bad.failures == 1
        again = fleet.call_all("ping")["bad"]
        assert bad.failures == 1
        assert isinstance(again, NodeFailure) and again.error.startswith(failure.error)
        assert "next retry in" in again.error
        assert [s.state for s in fleet.statuses()] == ["up", "up", "down"]
    finally:
        fleet.close()


def test_hung_agent_costs_only_its_own_timeout(live_cluster: TestCluster) -> None:
    fleet = Fleet(live_cluster.specs(), **live_cluster.ssh_options())
    node = live_cluster.nodes[1]
    try:
        fleet.connect_all()
        pid = fleet.session(node.name).hello["pid"]
        assert node.run(f"kill -STOP {pid}").returncode == 0
        try:
            t0 = time.monotonic()
            results = fleet.call_all("sample", timeout=1.0)
            elapsed = time.monotonic() - t0
        finally:
            node.run(f"kill -CONT {pid}")
        assert elapsed < 10  # the 1 s timeout, 10x bounded
        hung = results[node.name]
        assert isinstance(hung, NodeFailure)
        assert hung.error == "sample: agent not responding for 1 s (the connection is still open)"
        others = [n.name for n in live_cluster.nodes if n is not node]
        assert all(results[name]["hostname"] == name for name in others)
        # Resumed, it answers again on the same session: a slow node is not a dead one.
        assert fleet.session(node.name).call("ping", timeout=10)["time"] > 0
    finally:
        fleet.close()
