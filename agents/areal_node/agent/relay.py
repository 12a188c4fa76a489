"""Relaying: this agent starts other nodes' agents and carries their lines (a fan-out tree).

For sites where the console's host is the bottleneck (a handshake per node), the console
talks to a few agents, and each starts the agents of its children (`relay_start`: an argv
the console built, e.g. `ssh NODE python3 -c BOOTSTRAP HASH`) and passes lines both ways:

    console -> relay   `>NAME ` + a line for NAME's agent       (`>NAME` alone: close it)
    relay -> console   `<NAME ` + a line NAME's agent wrote
                       `<NAME {"event": "relay_exit", "status", "stderr"}` when it ended

A child that relays in turn nests the prefixes (`>A >B ...`, `<A <B ...`), so one console
connection carries a whole subtree and the protocol spoken with every agent is the same as
flat. A child's bootstrap asking for the node payload gets it from this agent's own payload
file (the console's link carries it once, to the relay). Nothing here listens on a socket.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import zlib
from typing import Any

from areal_node.agent.protocol import MAX_REPLY_BYTES, OpError, arg, op

TO_CHILD = b">"
FROM_CHILD = b"<"
# A child's name on the wire: one token (no space or newline), as a host name is.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@%-]{0,199}")
# The longest line carried up from a child (above the agent's own bound on a reply); a
# longer one is dropped to its end (the console's request for it then times out).
MAX_LINE = MAX_REPLY_BYTES + (16 << 20)
STDERR_LINES = 20
STOP_GRACE = 5.0  # seconds a closed child has to end before it is killed
NEED_SOURCE = b'{"event":"need_source"}'
READY = b'{"event":"ready"'


def payload_frame() -> bytes | None:
    """This agent's own payload, as a child's bootstrap reads it on a cache miss (`z`,
    the length, a newline, the zlib bytes); None when the agent does not run from one."""
    global _frame
    with _frame_lock:
        if _frame is None:
            import areal_node

            archive = getattr(getattr(areal_node, "__loader__", None), "archive", None)
            if not archive:
                return None
            try:
                with open(archive, "rb") as f:
                    packed = zlib.compress(f.read(), 6)
            except OSError:
                return None
            _frame = b"z" + str(len(packed)).encode() + b"\n" + packed
        return _frame


_frame: bytes | None = None
_frame_lock = threading.Lock()


class Child:
    """One relayed agent: its process, and the threads carrying its output up."""

    def __init__(self, agent: Any, name: str, argv: list[str]) -> None:
        self.agent = agent
        self.name = name
        self.prefix = FROM_CHILD + name.encode() + b" "
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a signal to the relay's group is not the child's
        )
        self._send_lock = threading.Lock()
        self._stderr: list[str] = []
        self._ready = False
        # Closed by the console (or replaced by a new child of the name): nothing more of
        # it goes up, not even its end, which would otherwise reach the new one's channel.
        self.closed = False
        self._err = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err.start()
        threading.Thread(target=self._carry, name=f"relay-{name}", daemon=True).start()

    def send(self, data: bytes) -> None:
        with self._send_lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # it ended: its relay_exit says why

    def close(self) -> None:
        """EOF on its stdin ends the child (and an ssh in between); killed if it lingers."""
        self.closed = True
        with self._send_lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
        timer = threading.Timer(STOP_GRACE, self._kill)
        timer.daemon = True
        timer.start()

    def _kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except OSError:
                pass

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in iter(lambda: self.proc.stderr.readline(4096), b""):  # type: ignore[union-attr]
            text = raw.decode(errors="replace").strip()
            if text:
                self._stderr.append(text[:500])
                del self._stderr[:-STDERR_LINES]

    def _carry(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            line = out.readline(MAX_LINE + 1)
            if not line:
                break
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while True:  # drop the rest of an over-long line, never hold it
                    rest = out.readline(1 << 20)
                    if not rest or rest.endswith(b"\n"):
                        break
                continue
            if self.closed:
                continue
            if not self._ready:
                if line.startswith(NEED_SOURCE):
                    frame = payload_frame()
                    if frame is not None:
                        self.send(frame)
                        continue
                elif line.startswith(READY):
                    self._ready = True
            self.agent._write(self.prefix + (line if line.endswith(b"\n") else line + b"\n"))
        status = self.proc.wait()
        self._err.join(2.0)
        if self.agent.relays.get(self.name) is self:
            del self.agent.relays[self.name]
        if self.closed:
            return
        message = {"event": "relay_exit", "status": status, "stderr": self._stderr[-STDERR_LINES:]}
        self.agent._write(self.prefix + json.dumps(message).encode() + b"\n")


def forward(agent: Any, text: bytes) -> None:
    """A `>NAME line` from the console: the line to NAME's agent (`>NAME` alone: close it)."""
    name, _, rest = text[len(TO_CHILD) :].partition(b" ")
    child = agent.relays.get(name.decode(errors="replace"))
    if child is None:
        return  # ended (its relay_exit is on its way) or never started: nothing to carry
    if rest.strip():
        child.send(rest + b"\n")
    else:
        child.close()


def close_all(agent: Any) -> None:
    """The console went away: end every child (EOF on its stdin)."""
    for child in list(agent.relays.values()):
        child.close()


@op("relay_start")
def op_relay_start(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Start the agent of child `node` with `argv` (built by the console: an argv list,
    never a shell string); its lines travel as `<node ...`. A child of that name still
    running is closed first (the console reconnecting it)."""
    name = arg(args, "node", str, "")
    argv = args.get("argv")
    if not _NAME.fullmatch(name):
        raise OpError(f"bad relay node name {name[:80]!r}")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise OpError("argument 'argv' must be a non-empty list of strings")
    old = agent.relays.pop(name, None)
    if old is not None:
        old.close()
    try:
        child = Child(agent, name, argv)
    except OSError as exc:
        raise OpError(f"cannot start {argv[0]!r} for {name}: {exc.strerror or exc}") from None
    agent.relays[name] = child
    return {"node": name, "pid": child.proc.pid}
