"""Fleet behaviour that needs no SSH: backoff schedule, states, a local agent."""

from __future__ import annotations

from typing import Any

import pytest
from areal_console.core.connection.client import AgentDisconnected
from areal_console.core.connection.fleet import Backoff, Fleet, NodeFailure, NodeSession
from areal_console.core.targets.resolve import NodeSpec


def test_backoff_doubles_up_to_the_cap() -> None:
    backoff = Backoff(initial=1.0, factor=2.0, maximum=30.0, jitter=0.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [1, 2, 4, 8, 16, 30, 30]
    jittery = Backoff(initial=10.0, jitter=0.1)
    assert all(9.0 <= jittery.delay(1) <= 11.0 for _ in range(50))


def test_local_session_reports_states_and_latency() -> None:
    events: list[tuple[str, str | None]] = []

    def on_event(session: NodeSession, message: dict[str, Any]) -> None:
        if message["event"] == "state":
            events.append((message["state"], message["error"]))

    fleet = Fleet([NodeSpec(name="here")], on_event=on_event)
    try:
        hello = fleet.connect_all()["here"]
        assert hello["protocol"] == 1
        status = fleet.statuses()[0]
        assert (status.name, status.address, status.state, status.error) == (
            "here",
            "local",
            "up",
            None,
        )
        assert status.latency is not None and status.latency < 5
        assert status.connect_seconds is not None
    finally:
        fleet.close()
    assert events == [("connecting", None), ("up", None), ("down", "closed")]


def test_bad_transport_is_a_node_failure_with_backoff() -> None:
    fleet = Fleet(
        [NodeSpec(name="odd", transport="carrier-pigeon")],
        backoff=Backoff(initial=60.0, maximum=60.0, jitter=0.0),
    )
    first = fleet.connect_all()["odd"]
    assert isinstance(first, NodeFailure)
    assert first.error == "unknown transport 'carrier-pigeon' for node odd"
    session = fleet.session("odd")
    assert session.failures == 1
    retry_in = session.status().retry_in
    assert retry_in is not None and 59 < retry_in <= 60
    with pytest.raises(AgentDisconnected, match=r"\(next retry in 60s\)"):
        session.call("ping")
    with pytest.raises(AgentDisconnected):
        session.connect(force=True)  # a forced retry really tries again
    assert session.failures == 2
    with pytest.raises(ValueError, match="no unknown host key"):
        session.trust_host_key()
