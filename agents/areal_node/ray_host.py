"""The node agent inside a Ray actor: what the console starts on each Ray node.

Standard library only, and no import of `ray`: the console wraps `AgentHost` with
`ray.remote` and ships it by value, so nothing needs installing on the cluster. The
agent's own code arrives as the payload bytes, checked against their sha256 before
anything of it runs; it is served on a pair of pipes exactly as over SSH stdio, and the
console relays the JSON lines through `send` and `recv` calls.

Lease: every call renews it; when no call came for `lease` seconds (the console is gone,
stopped or cut off) the actor's process exits, so nothing is left running on the cluster.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any

DEFAULT_LEASE = 3.0
RECV_MAX_WAIT = 2.0  # one recv call waits at most this long for a line
RECV_MAX_BYTES = 8 * 1024 * 1024  # lines handed over by one recv call (at least one line)


def load_agent(payload: bytes, sha256: str) -> Any:
    """The agent's `Agent` class from the node payload (the package as one zip), after
    checking its hash. The zip goes to a new private file and first on `sys.path`, and any
    `areal_node` this process imported before is dropped: the agent that runs is the one
    whose hash was checked, whatever else the node has installed."""
    digest = hashlib.sha256(payload).hexdigest()
    if digest != sha256:
        raise ValueError(f"agent payload hash mismatch: got {digest}, expected {sha256}")
    home = tempfile.mkdtemp(prefix="areal-agent-")  # mode 0700, ours alone
    path = os.path.join(home, f"payload-{sha256}.pyz")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    for name in [m for m in sys.modules if m == "areal_node" or m.startswith("areal_node.")]:
        del sys.modules[name]
    sys.path.insert(0, path)
    importlib.invalidate_caches()
    module = importlib.import_module("areal_node.agent.serve")
    if not getattr(module, "__file__", "").startswith(path):
        raise ImportError(f"the agent came from {module.__file__}, not from the payload")
    return module.Agent


class AgentHost:
    """One node agent served inside this process; lines relayed through method calls."""

    def __init__(self, payload: bytes, sha256: str, lease: float = DEFAULT_LEASE) -> None:
        self._lease = float(lease)
        self._last_call = time.monotonic()
        self._lines: deque[bytes] = deque()
        self._ready = threading.Condition()
        self._ended: str | None = None
        self._started = time.time()
        agent_class = load_agent(payload, sha256)
        to_agent_r, to_agent_w = os.pipe()
        from_agent_r, from_agent_w = os.pipe()
        self._to_agent = os.fdopen(to_agent_w, "wb")
        self._send_lock = threading.Lock()
        agent_in, agent_out = os.fdopen(to_agent_r, "rb"), os.fdopen(from_agent_w, "wb")
        from_agent = os.fdopen(from_agent_r, "rb")

        def serve() -> None:
            try:
                agent_class(stdin=agent_in, stdout=agent_out).serve()
            finally:
                agent_in.close()
                agent_out.close()

        def pump() -> None:
            reason = "the agent ended"
            try:
                for line in iter(from_agent.readline, b""):
                    with self._ready:
                        self._lines.append(line)
                        self._ready.notify_all()
            except (OSError, ValueError) as exc:
                reason = f"the agent's output broke: {exc}"
            with self._ready:
                self._ended = reason
                self._ready.notify_all()

        threading.Thread(target=serve, name="areal-agent", daemon=True).start()
        threading.Thread(target=pump, name="areal-agent-out", daemon=True).start()
        threading.Thread(target=self._watch_lease, name="areal-agent-lease", daemon=True).start()

    def _renew(self) -> None:
        self._last_call = time.monotonic()

    def _watch_lease(self) -> None:
        while True:
            time.sleep(min(0.5, self._lease / 4))
            if time.monotonic() - self._last_call > self._lease:
                # The console is gone: leave nothing running. os._exit, not sys.exit: the
                # agent's threads (py-spy runs, polls) must not keep the process alive.
                os._exit(0)

    def ready(self) -> dict[str, Any]:
        """Where the agent runs: for the console's records and the user."""
        self._renew()
        return {"pid": os.getpid(), "python": sys.version.split()[0], "started": self._started}

    def send(self, data: bytes) -> None:
        self._renew()
        with self._send_lock:
            self._to_agent.write(data)
            self._to_agent.flush()

    def recv(self, wait: float = 0.5) -> tuple[list[bytes], str | None]:
        """The agent's lines so far (waiting up to `wait` seconds for the first), and
        why it ended once it has."""
        self._renew()
        deadline = time.monotonic() + min(max(wait, 0.0), RECV_MAX_WAIT)
        out: list[bytes] = []
        size = 0
        with self._ready:
            while not self._lines and self._ended is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._ready.wait(left)
            while self._lines and (not out or size + len(self._lines[0]) <= RECV_MAX_BYTES):
                line = self._lines.popleft()
                out.append(line)
                size += len(line)
            ended = self._ended if not self._lines else None
        self._renew()
        return out, ended

    def close(self) -> None:
        """End the agent (EOF on its input); the process exits when the lease runs out."""
        self._lease = min(self._lease, 1.0)
        with self._send_lock:
            try:
                self._to_agent.close()
            except OSError:
                pass
