"""One agent session per node, and parallel fan-out over all of them.

Every call into a node runs in a bounded thread pool, so a slow or dead node never blocks
the others; its failure comes back as data (`NodeFailure`) next to the other results.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from areal_console.core.client import AgentClient, AgentDisconnected, AgentError
from areal_console.core.targets import NodeSpec
from areal_console.core.transport import Channel, LocalChannel

EventCallback = Callable[["NodeSession", dict[str, Any]], None]

MAX_PARALLEL = 64


@dataclass
class NodeFailure:
    """A node that could not answer: why, in words a user can act on."""

    node: str
    error: str

    def __str__(self) -> str:
        return f"{self.node}: {self.error}"


def open_channel(spec: NodeSpec, **options: Any) -> Channel:
    if spec.transport == "local":
        return LocalChannel()
    if spec.transport == "ssh":
        from areal_console.core.ssh import open_ssh_channel

        return open_ssh_channel(spec, **options)
    if spec.transport == "slurm":
        from areal_console.core.slurm_channel import open_slurm_channel

        channel: Channel = open_slurm_channel(spec, **options)
        return channel
    raise ValueError(f"unknown transport {spec.transport!r} for node {spec.name}")


class NodeSession:
    """The console's live connection to one node's agent."""

    def __init__(self, spec: NodeSpec, on_event: EventCallback | None = None, **options: Any):
        self.spec = spec
        self.options = options
        self.on_event = on_event
        self.state = "new"  # new | connecting | up | down
        self.error: str | None = None
        self.latency: float | None = None
        self.hello: dict[str, Any] = {}
        self.client: AgentClient | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.spec.name

    def connect(self, timeout: float = 30.0) -> None:
        """(Re)connect and handshake; on failure the session is `down` with the reason."""
        with self._lock:
            if self.client is not None and self.client.alive:
                return
            self.state, self.error = "connecting", None
            try:
                t0 = time.perf_counter()
                channel = open_channel(self.spec, **self.options)
                client = AgentClient(channel, on_event=self._event)
                self.hello = client.start(timeout=timeout)
                self.latency = time.perf_counter() - t0
                self.client = client
                self.state = "up"
            except (AgentError, AgentDisconnected, OSError, ValueError) as exc:
                self.state, self.error = "down", str(exc) or exc.__class__.__name__
                raise AgentDisconnected(self.error) from exc

    def _event(self, message: dict[str, Any]) -> None:
        if message.get("event") == "closed":
            self.state, self.error = "down", message.get("reason")
        if self.on_event is not None:
            self.on_event(self, message)

    def call(self, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """One request; reconnects first if the agent went away."""
        if self.client is None or not self.client.alive:
            self.connect()
        assert self.client is not None
        try:
            t0 = time.perf_counter()
            result = self.client.request(op, args, timeout=timeout)
            self.latency = time.perf_counter() - t0
            return result
        except AgentDisconnected as exc:
            self.state, self.error = "down", str(exc)
            raise

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        self.state = "down" if self.state != "new" else self.state


class Fleet:
    """All nodes of a target, each with its own session."""

    def __init__(
        self,
        specs: Iterable[NodeSpec],
        on_event: EventCallback | None = None,
        max_parallel: int = MAX_PARALLEL,
        **options: Any,
    ) -> None:
        self.sessions = [NodeSession(spec, on_event=on_event, **options) for spec in specs]
        self.max_parallel = max_parallel

    def __iter__(self) -> Iterator[NodeSession]:
        return iter(self.sessions)

    def __len__(self) -> int:
        return len(self.sessions)

    def session(self, name: str) -> NodeSession:
        for s in self.sessions:
            if s.name == name:
                return s
        raise KeyError(name)

    def fan_out(
        self, fn: Callable[[NodeSession], Any], sessions: Iterable[NodeSession] | None = None
    ) -> dict[str, Any]:
        """Run `fn(session)` on every node in parallel; failures become `NodeFailure`s."""
        chosen = list(self.sessions if sessions is None else sessions)
        if not chosen:
            return {}

        def guarded(session: NodeSession) -> Any:
            try:
                return fn(session)
            except (AgentError, AgentDisconnected, OSError, ValueError) as exc:
                return NodeFailure(session.name, str(exc) or exc.__class__.__name__)

        workers = max(1, min(self.max_parallel, len(chosen)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleet") as pool:
            results = list(pool.map(guarded, chosen))
        return {s.name: r for s, r in zip(chosen, results, strict=True)}

    def connect_all(self, timeout: float = 30.0) -> dict[str, Any]:
        def connect(session: NodeSession) -> dict[str, Any]:
            session.connect(timeout)
            return session.hello

        return self.fan_out(connect)

    def call_all(
        self, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        """The same request to every node at once: name -> result or `NodeFailure`."""
        return self.fan_out(lambda s: s.call(op, args, timeout))

    def close(self) -> None:
        self.fan_out(lambda s: s.close())
