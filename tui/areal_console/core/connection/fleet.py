"""One agent session per node, and parallel fan-out over all of them.

Every call into a node runs in a bounded thread pool, so a slow or dead node never blocks
the others; its failure comes back as data (`NodeFailure`) next to the other results.

A session is `new`, `connecting`, `up` or `down` (with the reason in `error`). A dropped
link (sshd gone, agent killed) makes it `down`; the next call reconnects at once, and
after a failed connect further attempts wait with exponential backoff, failing fast in
between with the last reason. Bringing a node back by itself, on that schedule, is the
monitor's job (`monitor.FleetMonitor`, one supervising thread per node). State changes are
reported to `on_event` as `{"event": "state", "state", "error"}` messages.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from areal_node.agent.threads import parallel_map

from areal_console.core.common.errors import UserError
from areal_console.core.connection.client import AgentClient, AgentDisconnected, AgentError
from areal_console.core.connection.transport import Channel, InProcessChannel, LocalChannel
from areal_console.core.targets.options import (
    DEFAULT_FANOUT_CONCURRENCY,
    DEFAULT_MAX_STARTUPS,
    DEFAULT_NODE_TIMEOUT,
)
from areal_console.core.targets.specs import NodeSpec

EventCallback = Callable[["NodeSession", dict[str, Any]], None]

MAX_PARALLEL = DEFAULT_FANOUT_CONCURRENCY
DEFAULT_START_TIMEOUT = 30.0  # connect + agent start, when no connect_timeout is given
MAX_CONNECTING = 32  # concurrent SSH handshakes: key exchange is CPU-heavy on both ends


TIMEOUT_PREFIX = "timeout"  # a node past its deadline: `timeout 5 s: ...`


@dataclass
class NodeFailure:
    """A node that could not answer: why, in words a user can act on."""

    node: str
    error: str

    def __str__(self) -> str:
        return f"{self.node}: {self.error}"


@dataclass(frozen=True)
class Backoff:
    """Delays between failed connect attempts: initial * factor**n, capped, with jitter."""

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 30.0
    jitter: float = 0.1

    def delay(self, failures: int) -> float:
        base = min(self.maximum, self.initial * self.factor ** max(0, failures - 1))
        return base * (1.0 + random.uniform(-self.jitter, self.jitter))


@dataclass(frozen=True)
class NodeStatus:
    """A snapshot of one session, for tables and JSON."""

    name: str
    address: str
    state: str
    error: str | None
    latency: float | None
    connect_seconds: float | None
    retry_in: float | None
    hello: dict[str, Any]
    unknown_host_key: str | None  # the fingerprint waiting for the user's decision


def open_channel(spec: NodeSpec, in_process: bool = False, **options: Any) -> Channel:
    """The channel to `spec`'s agent. `start_timeout` (the session's deadline for the agent
    to start) matters only to a shared Slurm step, which fails its silent nodes before it."""
    start_timeout = options.pop("start_timeout", None)
    if spec.transport == "local":
        return InProcessChannel() if in_process else LocalChannel()
    if spec.transport == "ssh":
        from areal_console.core.connection.ssh import open_ssh_channel

        return open_ssh_channel(spec, **options)
    if spec.transport == "slurm":
        from areal_console.core.slurm.channel import open_slurm_channel

        channel: Channel = open_slurm_channel(spec, start_timeout=start_timeout, **options)
        return channel
    if spec.transport == "ray":
        return _open_ray(spec, **options)
    raise ValueError(f"unknown transport {spec.transport!r} for node {spec.name}")


def _open_ray(spec: NodeSpec, **options: Any) -> Channel:
    """The agent actor on the node; SSH to its IP instead when Ray can't place it and the
    user allowed that (`--ray-ssh`), the channel then saying `via = "ssh"`."""
    import dataclasses

    from areal_console.core.connection.transport import ChannelClosed
    from areal_console.core.ray.channel import open_ray_channel

    try:
        return open_ray_channel(spec, **options)
    except (ChannelClosed, UserError) as exc:
        if spec.ray is None or not spec.ray.ssh_fallback:
            raise
        reason = str(exc)
    from areal_console.core.connection.ssh import open_ssh_channel

    try:
        return open_ssh_channel(dataclasses.replace(spec, transport="ssh", ray=None), **options)
    except Exception as exc:
        raise ChannelClosed(f"{reason}; over SSH at {spec.host} instead: {exc}") from None


def _via(spec: NodeSpec) -> str:
    return "ssh" if spec.transport == "ray" else spec.transport


def _describe(exc: BaseException) -> str:
    return str(exc) or exc.__class__.__name__


class NodeSession:
    """The console's live connection to one node's agent."""

    def __init__(
        self,
        spec: NodeSpec,
        on_event: EventCallback | None = None,
        *,
        backoff: Backoff | None = None,
        connect_slots: threading.Semaphore | None = None,
        probe_gpus: bool = True,
        in_process: bool = False,
        **options: Any,
    ):
        self.spec = spec
        # How long a connect may take, agent start included (None: see `start_timeout`).
        self._start_limit: float | None = options.pop("start_timeout", None)
        self.options = options  # passed to the transport (ssh: accept_new_hosts, ...)
        # False: the handshake leaves NVML alone (a stack capture never reads GPUs).
        self.probe_gpus = probe_gpus
        # A local node's agent as a thread of this process (one-shot commands).
        self.in_process = in_process
        self.on_event = on_event
        self.backoff = backoff or Backoff()
        self.state = "new"  # new | connecting | up | down
        self.via = spec.transport  # how the agent is reached once connected (see connect)
        self.error: str | None = None
        self.latency: float | None = None  # seconds for one ping round trip
        self.connect_seconds: float | None = None  # last successful connect + handshake
        self.hello: dict[str, Any] = {}
        self.client: AgentClient | None = None
        self.unknown_host_key: Any = None  # ssh.UnknownHostKey awaiting trust_host_key()
        self.failures = 0  # consecutive failed connects
        self.retry_at: float | None = None  # monotonic time before which we fail fast
        self._lock = threading.Lock()
        self._connect_slots = connect_slots
        self._closed = threading.Event()
        # token -> callback for the agent's `pyspy_progress` events of a running capture
        self.progress_listeners: dict[str, Callable[[dict[str, Any]], None]] = {}
        # In a fan-out tree (`Fleet(fanout_tree=K)`): the node whose agent starts this one
        # (None: the console connects to it), how it does (the argv it runs), and whether
        # this node's agent relays for others.
        self.relay_parent: NodeSession | None = None
        self.relay_argv: Callable[[NodeSpec], list[str]] | None = None
        self.relays_for_others = False

    @property
    def name(self) -> str:
        return self.spec.name

    # state ------------------------------------------------------------------------------
    def _set_state(self, state: str, error: str | None = None) -> None:
        changed = (state, error) != (self.state, self.error)
        self.state, self.error = state, error
        if changed and self.on_event is not None:
            # A broken subscriber must not break the session.
            with contextlib.suppress(Exception):
                self.on_event(self, {"event": "state", "state": state, "error": error})

    def status(self) -> NodeStatus:
        retry_in = None
        if self.state == "down" and self.retry_at is not None:
            retry_in = max(0.0, self.retry_at - time.monotonic())
        key = self.unknown_host_key
        return NodeStatus(
            name=self.name,
            address=self.spec.address,
            state=self.state,
            error=self.error,
            latency=self.latency,
            connect_seconds=self.connect_seconds,
            retry_in=retry_in,
            hello=dict(self.hello),
            unknown_host_key=getattr(key, "fingerprint", None),
        )

    # connecting -------------------------------------------------------------------------
    @property
    def start_timeout(self) -> float:
        """How long a connect may take, agent start included: `start_timeout` when given
        (--connect-timeout on the command line); else the transport's `connect_timeout`,
        except for a Slurm step, whose launch alone may take srun's MessageTimeout (10 s
        by default) and a fallback: `DEFAULT_START_TIMEOUT` there."""
        if self._start_limit is not None:
            return float(self._start_limit)
        value = self.options.get("connect_timeout")
        if self.spec.transport == "slurm" or not value:
            return DEFAULT_START_TIMEOUT
        return float(value)

    def connect(self, timeout: float | None = None, force: bool = False) -> dict[str, Any]:
        """(Re)connect and handshake; returns `hello`. On failure the session is `down`.

        While in backoff after a failed attempt, fails fast with the last reason unless
        `force` is given (a user pressing "retry").
        """
        timeout = self.start_timeout if timeout is None else timeout
        with self._lock:
            if self.client is not None and self.client.alive:
                return self.hello
            self._closed.clear()  # an explicit connect reopens a closed session
            now = time.monotonic()
            if not force and self.retry_at is not None and now < self.retry_at:
                raise AgentDisconnected(f"{self.error} (next retry in {self.retry_at - now:.0f}s)")
            self._set_state("connecting")
            slots = self._connect_slots
            t0 = time.perf_counter()
            client: AgentClient | None = None
            try:
                channel = self._open(slots, timeout)
                client = AgentClient(channel, on_event=self._client_event)
                # How the agent was reached: a Ray node's may be "ssh" (the fallback).
                self.via = getattr(channel, "via", None) or _via(self.spec)
                self.client = client
                hello = client.start(timeout=timeout, gpus=self.probe_gpus)
            except Exception as exc:  # every failure is data: the node is down, and why
                self.client = None
                if client is not None:
                    client.close()
                self._failed(exc)
                raise AgentDisconnected(self.error or "connect failed") from exc
            if self._closed.is_set():  # closed while we were connecting: do not linger
                self.client = None
                client.close()
                raise AgentDisconnected("session closed")
            self.connect_seconds = time.perf_counter() - t0
            self.hello = hello
            self.failures, self.retry_at, self.unknown_host_key = 0, None, None
            self._set_state("up")
        with contextlib.suppress(AgentError, AgentDisconnected):
            self.ping()  # on failure the state already says what happened
        return self.hello

    def _open(self, slots: threading.Semaphore | None, timeout: float) -> Channel:
        """This node's channel: through its relay in a fan-out tree (no connect slot: the
        relay's agent does the handshake), else its own; one that relays for others is
        wrapped in a hub routing their lines."""
        if self.relay_parent is not None:
            from areal_console.core.connection.relay import open_relayed

            assert self.relay_argv is not None
            return open_relayed(self.relay_parent, self.spec, self.relay_argv(self.spec), timeout)
        if slots is not None:
            slots.acquire()
        try:
            channel = open_channel(
                self.spec, self.in_process, start_timeout=timeout, **self.options
            )
        finally:
            if slots is not None:
                slots.release()
        if self.relays_for_others:
            from areal_console.core.connection.relay import RelayHub

            return RelayHub(channel, self.name).own
        return channel

    def _failed(self, exc: BaseException) -> None:
        from_ssh = exc.__class__.__name__ == "UnknownHostKey"
        self.unknown_host_key = exc if from_ssh else None
        self.failures += 1
        self.retry_at = time.monotonic() + self.backoff.delay(self.failures)
        self._set_state("down", _describe(exc))

    def _client_event(self, message: dict[str, Any]) -> None:
        if message.get("event") == "pyspy_progress":
            listener = self.progress_listeners.get(str(message.get("token")))
            if listener is not None:
                with contextlib.suppress(Exception):
                    listener(message)
            return
        # Only the current client's end matters; an old one closing is history.
        current_ended = self.client is not None and not self.client.alive
        if message.get("event") == "closed" and current_ended and not self._closed.is_set():
            self._set_state("down", message.get("reason"))
        if self.on_event is not None:
            self.on_event(self, message)

    def trust_host_key(self) -> None:
        """Accept the unknown host key the last connect saw, and allow a retry at once."""
        key = self.unknown_host_key
        if key is None:
            raise ValueError(f"{self.name}: no unknown host key to trust")
        key.trust()
        self.unknown_host_key, self.retry_at = None, None

    # requests ---------------------------------------------------------------------------
    def call(self, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """One request; reconnects first if the agent went away (subject to backoff)."""
        client = self.client
        if client is None or not client.alive:
            self.connect()
            client = self.client
        assert client is not None
        try:
            return client.request(op, args, timeout=timeout)
        except AgentDisconnected as exc:
            if self.client is client:
                self._set_state("down", _describe(exc))
            raise

    def ping(self, timeout: float = 10.0) -> float:
        """Round-trip seconds for one `ping`; updates `latency`."""
        t0 = time.perf_counter()
        self.call("ping", timeout=timeout)
        self.latency = time.perf_counter() - t0
        return self.latency

    def close(self) -> None:
        self._closed.set()
        client, self.client = self.client, None
        if client is not None:
            client.close()
        if self.state != "new":
            self._set_state("down", "closed")


class Fleet:
    """All nodes of a target, each with its own session.

    A fan-out works on at most `max_parallel` nodes at once, and gives each node
    `node_timeout` seconds from when its turn starts: a node still busy then is reported
    as a `NodeFailure` ("timeout 60 s: ...") and the fan-out returns without it."""

    def __init__(
        self,
        specs: Iterable[NodeSpec],
        on_event: EventCallback | None = None,
        max_parallel: int = MAX_PARALLEL,
        *,
        max_connecting: int = MAX_CONNECTING,
        backoff: Backoff | None = None,
        node_timeout: float | None = DEFAULT_NODE_TIMEOUT,
        max_startups: int = DEFAULT_MAX_STARTUPS,
        fanout_tree: int | None = None,
        tree_ssh_config: str | None = None,
        relay_argv: Callable[[NodeSpec], list[str]] | None = None,
        **options: Any,
    ) -> None:
        slots = threading.BoundedSemaphore(max(1, max_connecting))
        specs = list(specs)
        if any(s.transport in ("ssh", "ray") for s in specs):
            options["max_startups"] = max_startups  # the SSH transport paces its handshakes
        self.sessions = [
            NodeSession(
                spec,
                on_event=on_event,
                backoff=backoff,
                connect_slots=slots,
                **options,
            )
            for spec in specs
        ]
        self.max_parallel = max_parallel
        self.node_timeout = node_timeout
        self.fanout_tree = fanout_tree or None
        if self.fanout_tree:
            self._plant_tree(self.fanout_tree, tree_ssh_config, relay_argv, options)

    def _plant_tree(
        self,
        fanout: int,
        ssh_config: str | None,
        relay_argv: Callable[[NodeSpec], list[str]] | None,
        options: dict[str, Any],
    ) -> None:
        """Give each node beyond the first `fanout` a relay (`relay.plan_tree`): SSH nodes
        whose names travel as one word (every node, when `relay_argv` says how to start
        them); the others stay connected directly."""
        from areal_console.core.connection.relay import plan_tree, ssh_relay_argv, valid_name

        if relay_argv is None:
            timeout = float(options.get("connect_timeout") or DEFAULT_START_TIMEOUT)

            def relay_argv(spec: NodeSpec) -> list[str]:
                return ssh_relay_argv(spec, ssh_config, timeout)

            eligible = [s for s in self.sessions if s.spec.transport == "ssh"]
        else:
            eligible = list(self.sessions)
        eligible = [s for s in eligible if valid_name(s.name)]
        by_name = {s.name: s for s in eligible}
        for name, parent in plan_tree(list(by_name), fanout).items():
            if parent is None:
                continue
            session = by_name[name]
            session.relay_parent = by_name[parent]
            session.relay_argv = relay_argv
            by_name[parent].relays_for_others = True

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
        self,
        fn: Callable[[NodeSession], Any],
        sessions: Iterable[NodeSession] | None = None,
        *,
        node_timeout: float | None = None,
    ) -> dict[str, Any]:
        """Run `fn(session)` on every node in parallel; failures become `NodeFailure`s,
        and so does a node still running after its deadline (`node_timeout`, default the
        fleet's, counted from when its turn starts)."""
        chosen = list(self.sessions if sessions is None else sessions)
        if not chosen:
            return {}
        limit = self.node_timeout if node_timeout is None else node_timeout

        def guarded(session: NodeSession) -> Any:
            try:
                return fn(session)
            except (AgentError, AgentDisconnected, OSError, ValueError) as exc:
                return NodeFailure(session.name, _describe(exc))

        # On Ctrl-C this returns at once (the threads are daemons); the caller closes the
        # sessions, which ends their calls.
        if limit is None:
            results = parallel_map(guarded, chosen, self.max_parallel)
        else:
            results = deadline_map(guarded, chosen, self.max_parallel, limit, _overdue)
        return {s.name: r for s, r in zip(chosen, results, strict=True)}

    def connect_all(self, timeout: float | None = None, force: bool = False) -> dict[str, Any]:
        """Connect every node in parallel: name -> `hello` or `NodeFailure`."""
        return self.fan_out(lambda s: s.connect(timeout, force=force))

    def call_all(
        self, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        """The same request to every node at once: name -> result or `NodeFailure`."""
        return self.fan_out(lambda s: s.call(op, args, timeout))

    def ping_all(self, timeout: float = 10.0) -> dict[str, Any]:
        return self.fan_out(lambda s: s.ping(timeout))

    def statuses(self) -> list[NodeStatus]:
        return [s.status() for s in self.sessions]

    def unknown_host_keys(self) -> dict[str, Any]:
        """Sessions refused for an unknown host key: name -> `ssh.UnknownHostKey`."""
        return {s.name: s.unknown_host_key for s in self.sessions if s.unknown_host_key}

    def close(self) -> None:
        self.fan_out(lambda s: s.close(), node_timeout=None)


def _overdue(session: NodeSession, seconds: float) -> NodeFailure:
    return NodeFailure(
        session.name,
        f"{TIMEOUT_PREFIX} {seconds:g} s: no answer within the node deadline (--node-timeout)",
    )


def deadline_map(
    fn: Callable[[Any], Any],
    items: list[Any],
    limit: int,
    seconds: float,
    overdue: Callable[[Any, float], Any],
) -> list[Any]:
    """`[fn(x) for x in items]` on up to `limit` threads, each item given `seconds` from
    when its call starts: one still running then is `overdue(x, seconds)` in the result,
    and a new thread takes its place (the late call ends in the background, its result
    dropped). Returns when every item has a result."""
    results: list[Any] = [None] * len(items)
    done = [False] * len(items)
    started: dict[int, float] = {}  # index -> monotonic start, for calls still running
    pending = iter(range(len(items)))
    cond = threading.Condition()
    left = [len(items)]

    def work() -> None:
        while True:
            with cond:
                i = next(pending, None)
                if i is None:
                    return
                started[i] = time.monotonic()
                cond.notify_all()  # its deadline is one to wait for
            try:
                value = fn(items[i])
            except BaseException as exc:  # handed back as the item's result
                value = exc
            with cond:
                late = done[i]  # given up on already: a new thread took over
                if not late:
                    results[i], done[i] = value, True
                    started.pop(i, None)
                    left[0] -= 1
                    cond.notify_all()
            if late:
                return

    def spawn() -> None:
        threading.Thread(target=work, name="fan-out", daemon=True).start()

    for _ in range(min(max(1, limit), len(items))):
        spawn()
    with cond:
        while left[0]:
            now = time.monotonic()
            for i, t0 in list(started.items()):
                if now - t0 >= seconds:
                    results[i], done[i] = overdue(items[i], seconds), True
                    del started[i]
                    left[0] -= 1
                    spawn()
            if not left[0]:
                break
            ends = [t0 + seconds for t0 in started.values()]
            cond.wait(max(0.0, min(ends) - now) + 0.001 if ends else None)
    for value in results:
        if isinstance(value, BaseException):
            raise value
    return results
