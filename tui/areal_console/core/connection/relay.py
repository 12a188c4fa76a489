"""A fan-out tree: the console connects to a few agents, which start and relay for the rest.

With `--fanout-tree K` the console opens at most K connections (K relays); each relay's
agent starts its children's agents over the site's own transport (`ssh` from node to node,
the node's OpenSSH), and those may relay in turn, K children each (`plan_tree`). Lines to
and from a relayed agent carry the path of relays as prefixes (`>A >B line`, `<A <B line`:
see areal_node/agent/relay.py), so every node keeps its own `NodeSession`, speaking the
same protocol with the same deadlines as flat, and fails, by name and with its reason,
alone: a node whose agent cannot start, or under a relay that went down, is reported like
any node that did not answer.

What the tree saves is the console's connection set-up: one SSH handshake per relay, not
per node. Every node's replies still reach the console, relayed as they are (no merging on
the way).
"""

from __future__ import annotations

import json
import queue
import re
import shlex
import threading
from collections.abc import Callable
from typing import Any

from areal_console.core.connection.transport import (
    BOOTSTRAP,
    Channel,
    ChannelClosed,
    bootstrap_problem,
    resolving_argv,
)
from areal_console.core.targets.specs import NodeSpec

TO_CHILD = b">"
FROM_CHILD = b"<"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@%-]{0,199}")
EXIT_EVENT = b'{"event": "relay_exit"'

Path = tuple[str, ...]  # the relays below the console's connection, then the node
RelayArgv = Callable[[NodeSpec], list[str]]


def plan_tree(names: list[str], fanout: int) -> dict[str, str | None]:
    """Each node's parent (None: the console connects to it): at most `fanout` children
    under the console and under every relay, the rest spread evenly below the first
    `fanout` nodes, in the order given. 512 nodes, fan-out 32: 32 relays of 15 each."""
    parents: dict[str, str | None] = {}
    _attach(list(names), max(1, fanout), None, parents)
    return parents


def _attach(names: list[str], k: int, parent: str | None, parents: dict[str, str | None]) -> None:
    heads, rest = names[:k], names[k:]
    for name in heads:
        parents[name] = parent
    if not rest:
        return
    size, extra = divmod(len(rest), len(heads))
    start = 0
    for i, head in enumerate(heads):
        end = start + size + (1 if i < extra else 0)
        if end > start:
            _attach(rest[start:end], k, head, parents)
        start = end


def valid_name(name: str) -> bool:
    """A node name that can travel as a relay prefix (one token)."""
    return bool(_NAME.fullmatch(name))


def ssh_relay_argv(
    spec: NodeSpec, ssh_config: str | None = None, connect_timeout: float = 10.0
) -> list[str]:
    """What a relay runs to start `spec`'s agent: the node's own OpenSSH client, in batch
    mode (no password prompt; an unknown host key fails, it is never accepted), with the
    site's ssh config on the nodes (`ssh_config`: a file there; default the user's own)."""
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(connect_timeout))}"]  # fmt: skip
    if ssh_config:
        argv += ["-F", ssh_config]
    if spec.port:
        argv += ["-p", str(spec.port)]
    if spec.user:
        argv += ["-l", spec.user]
    if spec.identity_file:
        argv += ["-i", spec.identity_file]
    # No jump host: it is how the console reaches the cluster from outside, and nodes reach
    # each other directly (a site that needs one says so in the nodes' ssh config).
    argv += ["--", spec.host or spec.name]
    # The remote side runs it with the user's shell: one quoted command line.
    argv.append(shlex.join(resolving_argv(spec.python, BOOTSTRAP)))
    return argv


class RelayHub:
    """One console connection carrying a subtree: routes each line by its path prefix."""

    def __init__(self, channel: Channel, node: str) -> None:
        self.channel = channel
        self.node = node
        self._routes: dict[Path, RelayedChannel] = {}
        self._lock = threading.Lock()
        self.own = RelayedChannel(self, ())
        self._routes[()] = self.own
        threading.Thread(target=self._read_loop, name=f"relay-hub-{node}", daemon=True).start()

    def attach(self, path: Path) -> RelayedChannel:
        """The channel of the node at `path` (an older one there ends)."""
        channel = RelayedChannel(self, path)
        with self._lock:
            old = self._routes.get(path)
            self._routes[path] = channel
        if old is not None:
            old.end("replaced by a new connection")
        return channel

    def send(self, path: Path, data: bytes) -> None:
        prefix = b"".join(TO_CHILD + name.encode() + b" " for name in path)
        self.channel.send(prefix + data)

    def _read_loop(self) -> None:
        while True:
            line = self.channel.recv_line()
            if not line:
                break
            names: list[str] = []
            while line[:1] == FROM_CHILD:
                name, sep, rest = line[1:].partition(b" ")
                if not sep:
                    break
                names.append(name.decode(errors="replace"))
                line = rest
            with self._lock:
                route = self._routes.get(tuple(names))
            if route is not None:
                route.deliver(line)
        reason = self.channel.exit_reason()
        with self._lock:
            routes, self._routes = dict(self._routes), {}
        for path, route in routes.items():
            route.end(reason if not path else f"relay {self.node} is down: {reason}")

    def ended(self, path: Path, reason: str) -> None:
        """The node at `path` ended: so did everything it relayed for."""
        with self._lock:
            below = [p for p in self._routes if len(p) > len(path) and p[: len(path)] == path]
            routes = [self._routes.pop(p) for p in below]
        for route in routes:
            route.end(f"relay {path[-1]} is down: {reason}")


class RelayedChannel:
    """One node's `Channel` inside a `RelayHub` (path () is the relay's own agent)."""

    def __init__(self, hub: RelayHub, path: Path) -> None:
        self.hub = hub
        self.path = path
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._reason: str | None = None
        self.closed = False
        # With `push_to`, lines go straight to the node's client from the hub's reader
        # (no thread per node); until then they wait in `_lines`.
        self._push_lock = threading.RLock()
        self._on_line: Callable[[bytes], None] | None = None
        self._on_end: Callable[[], None] | None = None
        self._ended = False

    @property
    def what(self) -> str:
        node = self.path[-1] if self.path else self.hub.node
        parent = self.path[-2] if len(self.path) > 1 else self.hub.node
        return f"agent on {node} (relayed by {parent})" if self.path else f"agent on {node}"

    def deliver(self, line: bytes) -> None:
        if self.path and line.startswith(EXIT_EVENT):
            self.end(self._exit_reason(line))
            self.hub.ended(self.path, self._reason or "ended")
            return
        with self._push_lock:
            if self._on_line is None:
                self._lines.put(line)
                return
            if not self._ended:
                self._on_line(line)

    def push_to(self, on_line: Callable[[bytes], None], on_end: Callable[[], None]) -> None:
        """Hand every line to `on_line` (then the end to `on_end`) as it arrives, in the
        hub's reader thread; the lines already here first."""
        with self._push_lock:
            while True:
                try:
                    line = self._lines.get_nowait()
                except queue.Empty:
                    break
                if not line:
                    self._ended = True
                    break
                on_line(line)
            self._on_line, self._on_end = on_line, on_end
            ended = self._ended
        if ended:
            on_end()

    def _exit_reason(self, line: bytes) -> str:
        try:
            message = json.loads(line)
            status = int(message.get("status", -1))
            stderr = [str(s) for s in message.get("stderr", [])][-20:]
        except (ValueError, TypeError, AttributeError):
            return f"{self.what} ended"
        node = self.path[-1]
        problem = bootstrap_problem(stderr, None, node)
        if problem:
            return problem
        errors = [s for s in stderr if "error" in s.lower() or "denied" in s.lower()] or stderr
        why = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
        return f"{self.what} {why}" + (f": {errors[-1]}" if errors else "")

    def end(self, reason: str | None) -> None:
        if reason and self._reason is None:
            self._reason = reason
        with self._push_lock:
            if self._ended:
                return
            if self._on_end is None:
                self._lines.put(b"")
                return
            self._ended = True
            on_end = self._on_end
        on_end()

    # Channel --------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        if self._reason is not None or self.closed:
            raise ChannelClosed(self.exit_reason())
        self.hub.send(self.path, data)

    def recv_line(self) -> bytes:
        line = self._lines.get()
        if not line:
            self._lines.put(b"")  # EOF stays EOF
        return line

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.path:
            self.hub.channel.close()  # the relay's own connection: the whole subtree ends
            return
        try:
            self.hub.send(self.path, b"\n")  # `>... >NODE` alone: its relay closes it
        except (ChannelClosed, OSError):
            pass
        self.end("closed")

    def exit_reason(self) -> str:
        if self._reason is not None:
            return self._reason
        if not self.path:
            return self.hub.channel.exit_reason()
        return f"{self.what}: connection closed"


def relay_link(channel: Any) -> tuple[RelayHub, Path] | None:
    """Where a connected node's own children hang: its hub and path."""
    if isinstance(channel, RelayedChannel):
        return channel.hub, channel.path
    return None


def open_relayed(parent: Any, spec: NodeSpec, argv: list[str], timeout: float) -> RelayedChannel:
    """`spec`'s channel through `parent` (a `NodeSession`, connected here if it is not):
    registered in the parent's hub, then started by the parent's agent."""
    from areal_console.core.connection.client import AgentDisconnected, AgentError

    if not valid_name(spec.name):
        raise ChannelClosed(f"{spec.name!r} cannot be reached through a relay (not one word)")
    try:
        parent.connect(timeout)
    except (AgentDisconnected, AgentError, OSError) as exc:
        raise ChannelClosed(f"relay {parent.name} is down: {exc}") from None
    client = parent.client
    link = relay_link(client.channel if client is not None else None)
    if link is None:
        raise ChannelClosed(f"relay {parent.name} was connected without a relay link")
    hub, path = link
    channel = hub.attach((*path, spec.name))
    try:
        parent.call("relay_start", {"node": spec.name, "argv": argv}, timeout=timeout)
    except (AgentDisconnected, AgentError, OSError) as exc:
        channel.end(f"relay {parent.name} could not start {spec.name}'s agent: {exc}")
        raise ChannelClosed(channel.exit_reason()) from None
    return channel
