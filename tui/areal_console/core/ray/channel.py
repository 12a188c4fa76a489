"""The agent on a Ray node: an actor pinned to the node, speaking the agent's JSON lines.

One actor per node, placed with a hard node affinity and no resources reserved (no CPU,
no GPU), so a cluster whose every CPU the training job holds still admits it. The actor
class (`areal_node.ray_host.AgentHost`) is shipped by value and the agent as the node
payload (`payload.py`: the `areal_node` package as one zip) with its sha256, which the actor checks before running anything: nothing needs
installing on the cluster. Requests go through `send` calls; replies and the monitor
stream come back through a long-polling `recv` loop, which also renews the actor's lease
(it exits when the console has been gone for a few seconds).
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from typing import Any

from areal_console.core.common.errors import UserError
from areal_console.core.connection.payload import node_payload
from areal_console.core.connection.transport import ChannelClosed
from areal_console.core.ray.nodes import RAY_EXTRA, quiet_ray_client
from areal_console.core.ray.versions import (
    RayVersions,
    console_python,
    dashboard_ray_version,
    from_ray_error,
    mismatch_line,
)
from areal_console.core.targets.specs import NodeSpec

LEASE_SECONDS = 3.0  # the actor exits this long after the console's last call
POLL_WAIT = 0.5  # one recv call waits this long for a line (and renews the lease)
CALL_TIMEOUT = 10.0  # one relay call (send, recv) may take this long
NAMESPACE = "areal-console"

_session_lock = threading.Lock()
_session_address: str | None = None


class RayUnavailable(UserError):
    """The `[ray]` extra is missing, or this Ray can't talk to the cluster's."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            f"starting the agent on Ray nodes needs the [ray] extra ({RAY_EXTRA}); "
            "without it --ray lists the nodes only (or add --ray-ssh to reach them over SSH)"
        ) from None
    return ray


def connect_ray(address: str) -> Any:
    """`ray.init` once per process (a driver attached to the cluster at `address`)."""
    global _session_address
    ray = import_ray()
    with _session_lock:
        if ray.is_initialized():
            if _session_address not in (None, address):
                raise UserError(
                    f"already attached to the Ray cluster at {_session_address}, not {address}"
                )
            return ray
        # Ray Client (`ray://`) has no dashboard option, and logs as it connects.
        client = address.startswith("ray://")
        options = {} if client else {"include_dashboard": False}
        if client:
            quiet_ray_client()
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level="ERROR",
                **options,
            )
        except Exception as exc:  # version mismatch, refused token, no cluster: one line
            raise UserError(_init_failure(address, exc, ray.__version__)) from None
        _session_address = address
        _cluster_errors_to_stderr()
    return ray


def _cluster_errors_to_stderr() -> None:
    """A Ray driver prints the cluster's error messages (a node marked dead, a worker
    killed) on stdout, whatever `log_to_driver` says (`listen_error_messages` in
    ray/_private/worker.py, Ray 2.60): the console's stdout is its report (`--json`
    included), so they go to stderr. Ray looks the printer up in its module at each
    message; where this Ray has none, nothing changes."""
    worker = sys.modules.get("ray._private.worker")
    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "to_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        printer({**data, "is_err": True}, ignore_prefix)

    to_stderr.to_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr  # type: ignore[union-attr]


def _init_failure(address: str, exc: BaseException, version: str) -> str:
    text = " ".join(str(exc).split())[:400] or exc.__class__.__name__
    versions = from_ray_error(str(exc))
    if versions is None:  # failed before Ray's own check? The dashboard names its version.
        from areal_console.core.ray.nodes import auth_token, dashboard_of

        theirs = dashboard_ray_version(dashboard_of(address), auth_token())
        if theirs and theirs != version:
            versions = RayVersions(theirs, None, version, console_python())
    if versions is not None:
        return mismatch_line(address, versions)
    if "auth" in text.lower() and "token" in text.lower():
        return f"--ray: the Ray cluster at {address} refused this console: {text}"
    return f"--ray: can't attach to the Ray cluster at {address}: {text}"


def _host_class(ray: Any) -> Any:
    from areal_node import ray_host
    from ray import cloudpickle  # the pickler Ray ships actor classes with

    # By value: the cluster's workers need nothing of ours installed.
    cloudpickle.register_pickle_by_value(ray_host)
    return ray.remote(ray_host.AgentHost)


def _death(ray: Any, node_id: str) -> str | None:
    """Why Ray has the node dead (": reason", or ""), or None while it is alive or unknown.
    A reconnect to a lost node then fails at once instead of after the start timeout."""
    try:
        node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
    except Exception:  # the GCS not answering: the actor's start says more
        return None
    if node is None or node.get("Alive"):
        return None
    why = " ".join(str(node.get("DeathReasonMessage") or "").split())[:200]
    return f": {why}" if why else ""


class RayChannel:
    """A `Channel` to the agent actor on one Ray node."""

    via = "ray"

    def __init__(self, spec: NodeSpec, start_timeout: float = 30.0) -> None:
        target = spec.ray
        if target is None:
            raise ValueError(f"{spec.name}: no Ray target")
        self.node = spec.name
        ray = connect_ray(target.address)
        self._ray = ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        dead = _death(ray, target.node_id)
        if dead is not None:  # placing an actor there would wait for nothing
            raise ChannelClosed(f"Ray reports node {self.node} dead{dead}")
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._reason: str | None = None
        self._closed = threading.Event()
        self._send_lock = threading.Lock()
        started = time.perf_counter()
        payload = node_payload()
        self.actor = (
            _host_class(ray)
            .options(
                num_cpus=0,
                num_gpus=0,
                max_concurrency=4,  # recv waits while send runs
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(target.node_id, soft=False),
                name=None,
            )
            .remote(payload.data, payload.sha256, LEASE_SECONDS)
        )
        try:
            self.info = ray.get(self.actor.ready.remote(), timeout=start_timeout)
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)
            raise ChannelClosed(self._start_failure(exc, start_timeout)) from None
        self.start_seconds = time.perf_counter() - started
        self._pump = threading.Thread(target=self._poll, name=f"ray-recv-{spec.name}", daemon=True)
        self._pump.start()

    def _start_failure(self, exc: BaseException, timeout: float) -> str:
        name = exc.__class__.__name__
        if name == "GetTimeoutError":
            return (
                f"Ray did not place the agent actor on node {self.node} within {timeout:g}s "
                "(node affinity is hard: the node may be dead or out of memory)"
            )
        text = " ".join(str(exc).split())[:300]
        return f"the agent actor on node {self.node} failed to start: {name}: {text}"

    def _poll(self) -> None:
        ray = self._ray
        while not self._closed.is_set():
            try:
                lines, ended = ray.get(self.actor.recv.remote(POLL_WAIT), timeout=CALL_TIMEOUT)
            except Exception as exc:  # actor died, node lost, cluster gone
                self._end(self._call_failure(exc))
                return
            for line in lines:
                self._lines.put(line)
            if ended is not None:
                self._end(ended)
                return

    def _call_failure(self, exc: BaseException) -> str:
        if self._closed.is_set():
            return "closed"
        name = exc.__class__.__name__
        if name == "GetTimeoutError":
            return f"the agent actor on node {self.node} stopped answering ({CALL_TIMEOUT:g}s)"
        if name in ("ActorDiedError", "ActorUnavailableError", "RayActorError"):
            return f"the agent actor on node {self.node} died (node lost or process killed)"
        return f"the agent actor on node {self.node} failed: {name}"

    def _end(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason
        self._lines.put(b"")

    def send(self, data: bytes) -> None:
        if self._reason is not None or self._closed.is_set():
            raise ChannelClosed(self.exit_reason())
        with self._send_lock:  # one send at a time, each acknowledged: lines stay in order
            try:
                self._ray.get(self.actor.send.remote(data), timeout=CALL_TIMEOUT)
            except Exception as exc:
                reason = self._call_failure(exc)
                self._end(reason)
                raise ChannelClosed(reason) from None

    def recv_line(self) -> bytes:
        line = self._lines.get()
        if not line:
            self._lines.put(b"")  # every later reader sees the end too
        return line

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(Exception):
            self._ray.kill(self.actor, no_restart=True)
        self._end("closed")

    def exit_reason(self) -> str:
        return self._reason or "the agent actor ended"


def open_ray_channel(spec: NodeSpec, **options: Any) -> RayChannel:
    timeout = options.get("start_timeout") or options.get("connect_timeout") or 30.0
    return RayChannel(spec, start_timeout=float(timeout))
