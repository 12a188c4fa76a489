"""Live sampling of every node: agent sample streams, latest state per node, reconnects.

Each node's agent pushes a `sample` event every `interval` seconds over its own channel, so
a slow node delays nobody. The monitor keeps only the newest sample per node plus a short
GPU history and each process's RSS series (core/connection/sampling.py); views read `snapshot()` at their own pace. A node whose link drops is marked
down with the reason and reconnected with exponential backoff. No Textual here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.common.identity import login_user
from areal_console.core.connection.client import (
    AgentDisconnected,
    AgentError,
    AgentNotResponding,
    PendingReply,
)
from areal_console.core.connection.fleet import Fleet, NodeSession
from areal_console.core.connection.records import (
    GpuRow,
    ProcessRow,
    gpu_rows,
    process_rows,
    with_areal_world_sizes,
    with_readings,
)
from areal_console.core.connection.sampling import (
    GoneRank,
    IdleRank,
    MemoryTrend,
    SampleHistory,
    memory_trends,
)
from areal_console.core.rollout.trainer_watch import TrainerStates, TrainerWatch

HISTORY = 60  # samples of GPU utilisation kept per GPU (a minute at 1 Hz)
GONE_KEPT = 64  # ranks gone from their node, the newest kept
TRENDS_EVERY = 5.0  # seconds between RSS sparklines and growth verdicts on the screen


SampleRows = tuple[tuple[ProcessRow, ...], tuple[GpuRow, ...], str | None]


def sample_rows(data: dict[str, Any], previous: tuple[ProcessRow, ...] = ()) -> SampleRows:
    """A `sample` result's processes, GPUs and GPU error, typed (`previous`: the node's
    rows of its last sample, whose unchanged fields are not typed again)."""
    error = data.get("gpu_error")
    return (
        process_rows(data.get("processes"), previous),
        gpu_rows(data.get("gpus")),
        None if error is None else str(error),
    )


@dataclass
class NodeView:
    """What the console currently knows about one node."""

    name: str
    address: str
    state: str = "connecting"  # connecting | up | unresponsive | down
    error: str | None = None
    latency: float | None = None
    sample: dict[str, Any] | None = None
    received_at: float | None = None
    gpu_history: dict[int, deque[float]] = field(default_factory=dict)
    hello: dict[str, Any] = field(default_factory=dict)
    host_key: str | None = None  # "type fingerprint" of an unknown host key awaiting the user
    # The sample's records, typed once when it arrives (`take_sample`).
    processes: tuple[ProcessRow, ...] = ()
    gpus: tuple[GpuRow, ...] = ()
    gpu_error: str | None = None
    relay: str | None = None  # under --fanout-tree: the node whose agent carries this one's

    def __post_init__(self) -> None:
        if self.sample is not None and not (self.processes or self.gpus):
            self.take_sample(self.sample)

    def take_sample(self, data: dict[str, Any] | None, typed: SampleRows | None = None) -> None:
        """Hold the agent's `sample` result: its raw JSON and its rows (`typed`, when they
        were made already). `data` None: a readings-only sample (the raw JSON stays the
        last whole one; `typed` holds the new readings)."""
        if data is not None:
            self.sample = data
        elif typed is None:
            return
        self.processes, self.gpus, self.gpu_error = typed or sample_rows(data or {})

    @property
    def hostname(self) -> str:
        """The node's host name as its agent said hello ("" before it did)."""
        return str(self.hello.get("hostname") or "")

    @property
    def user(self) -> str:
        """Who the node's agent runs as ("" before it said hello)."""
        return str(self.hello.get("user") or "")

    def agent_processes(self) -> list[dict[str, Any]]:
        """Copies of the agent's process records (for captures, which take the protocol's
        records), with world sizes counted over every node."""
        return [p.agent_record() for p in self.processes]


class FleetMonitor:
    def __init__(
        self,
        fleet: Fleet,
        interval: float = 1.0,
        include_all: bool = False,
        *,
        ping_every: float = 5.0,
        ping_timeout: float = 5.0,
    ) -> None:
        self.fleet = fleet
        self.interval = interval
        self.include_all = include_all
        # While a node streams, a ping every `ping_every` s measures latency; one without an
        # answer in `ping_timeout` s marks the agent unresponsive (not the link down).
        self.ping_every = ping_every
        self.ping_timeout = ping_timeout
        self._views = {
            s.name: NodeView(s.name, s.spec.address,
                             relay=s.relay_parent.name if s.relay_parent else None)
            for s in fleet.sessions
        }  # fmt: skip
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._wake: dict[str, threading.Event] = {s.name: threading.Event() for s in fleet}
        self._stream_ids: dict[str, int] = {}  # node -> id of its current sample stream
        # node -> the stream whose whole sample the node's rows hold: a readings-only sample
        # applies only to the whole sample of its own stream (agent/readings.py).
        self._whole_from: dict[str, int] = {}
        # The trainer's version for the servers' version flags, read slowly from the job's
        # files (`nodes`' read) on a thread of its own.
        self.trainer = TrainerWatch(lambda: self.fleet.sessions, self._node_entries, login_user())
        # Each process's RSS across samples and the ranks gone from their node (`nodes
        # --samples` keeps the same history): fed as samples arrive, kept while this runs.
        self.history = SampleHistory()
        self.gone: deque[GoneRank] = deque(maxlen=GONE_KEPT)
        self._trends: dict[tuple[str, int], MemoryTrend] = {}
        self._trends_at = -math.inf
        self._idle: list[IdleRank] = []
        self._idle_at = -math.inf

    # public ---------------------------------------------------------------------------
    def start(self) -> None:
        for session in self.fleet.sessions:
            t = threading.Thread(
                target=self._supervise, args=(session,), name=f"monitor-{session.name}", daemon=True
            )
            t.start()
            self._threads.append(t)
        self.trainer.start()

    def stop(self) -> None:
        self._stop.set()
        self.trainer.stop()
        for wake in self._wake.values():
            wake.set()

    def snapshot(self) -> list[NodeView]:
        """A consistent copy of every node's view, in fleet order."""
        with self._lock:
            out = [
                dataclasses.replace(
                    v, gpu_history={i: deque(h, maxlen=HISTORY) for i, h in v.gpu_history.items()}
                )
                for v in self._views.values()
            ]
        counted = with_areal_world_sizes([v.processes for v in out])
        for view, rows in zip(out, counted, strict=True):
            view.processes = rows
        return out

    def trainer_state(self) -> TrainerStates | None:
        """Each run's trainer version and allowed lag as last read (None: not read, or no
        server reports a version)."""
        return self.trainer.state()

    def memory(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], MemoryTrend]:
        """For each (node, pid): its RSS sparkline and memory_growth flag, if any; worked
        out at most every TRENDS_EVERY seconds (a trend over minutes needs no 1 Hz
        verdict, and 4,096 sparklines a second would cost the console a core's percent)."""
        now = time.monotonic()
        with self._lock:
            if now - self._trends_at >= TRENDS_EVERY:
                self._trends = memory_trends(self.history)
                self._trends_at = now
            trends = self._trends
        return {k: trends[k] for k in keys if k in trends}

    def recent_gone(self) -> list[GoneRank]:
        with self._lock:
            return list(self.gone)

    def idle_gpus(self) -> list[IdleRank]:
        """Ranks whose GPUs idle while the other ranks' are busy, across the samples."""
        now = time.monotonic()
        with self._lock:
            if now - self._idle_at >= TRENDS_EVERY:
                self._idle = self.history.idle_ranks()
                self._idle_at = now
            return list(self._idle)

    def _node_entries(self) -> list[dict[str, Any]]:
        return [
            {"name": v.name, "state": v.state, "processes": v.agent_processes()}
            for v in self.snapshot()
        ]

    def trust_host_key(self, name: str) -> None:
        """The user accepted the node's unknown host key: remember it and connect now."""
        session = self.fleet.session(name)
        session.trust_host_key()
        self._update(name, host_key=None, state="connecting", error=None)
        self._wake[name].set()

    def set_include_all(self, include_all: bool) -> None:
        """Switch between ranks only and every Python process.

        Each connected node gets a new sample stream with the new setting and then loses
        its old one, on the same link: the node stays up (closing the link to restart
        would show it down for a moment). Samples of a replaced stream are dropped.
        """
        if include_all == self.include_all:
            return
        self.include_all = include_all
        for session in self.fleet.sessions:
            if session.client is not None and session.client.alive:
                threading.Thread(
                    target=self._restart_stream, args=(session, include_all),
                    name=f"restream-{session.name}", daemon=True,
                ).start()  # fmt: skip

    # internals ------------------------------------------------------------------------
    def _stream_args(self, include_all: bool) -> dict[str, Any]:
        """A sample stream, readings only while nothing else changes (agent/readings.py)."""
        return {"interval": self.interval, "all": include_all, "delta": True}

    def _restart_stream(self, session: NodeSession, include_all: bool) -> None:
        client = session.client
        if client is None:
            return
        try:
            reply = client.request("stream", self._stream_args(include_all))
        except (AgentDisconnected, AgentError):
            return  # the supervisor sees the link drop and reconnects with the new setting
        new_id = int(reply.get("stream", 0)) if isinstance(reply, dict) else 0
        with self._lock:
            old_id = self._stream_ids.get(session.name, 0)
            self._stream_ids[session.name] = max(old_id, new_id)
        if old_id and old_id != new_id:
            with contextlib.suppress(AgentDisconnected, AgentError):
                client.request("stream_stop", {"stream": old_id})

    def _update(self, name: str, **changes: Any) -> None:
        with self._lock:
            view = self._views[name]
            for key, value in changes.items():
                setattr(view, key, value)

    def _on_sample(self, name: str, data: dict[str, Any], stream: int = 0) -> None:
        # Off the lock: a big node has a thousand processes.
        typed = sample_rows(data, self._views[name].processes)
        self._take(name, data, typed, stream)

    def _on_readings(self, name: str, readings: Any, stream: int) -> None:
        """A readings-only sample: the node's rows of its last whole sample, new values."""
        view = self._views[name]
        if self._whole_from.get(name) != stream:
            return  # not the stream of the rows held: wait for its whole sample
        fitted = with_readings(view.processes, view.gpus, readings)
        if fitted is not None:
            self._take(name, None, (*fitted, view.gpu_error), stream)

    def _take(self, name: str, data: dict[str, Any] | None, typed: SampleRows, stream: int) -> None:
        with self._lock:
            # Stream ids grow per agent: a lower one is a stream being replaced.
            if stream < self._stream_ids.get(name, 0):
                return
            self._stream_ids[name] = max(stream, self._stream_ids.get(name, 0))
            if data is not None:
                self._whole_from[name] = stream
            elif self._whole_from.get(name) != stream:
                return
            view = self._views[name]
            view.take_sample(data, typed)
            view.received_at = time.time()
            self.gone.extend(self.history.add_rows(name, view.processes, view.received_at))
            self.history.add_gpu_rows(name, view.gpus, view.processes)
            view.state, view.error = "up", None
            for gpu in view.gpus:
                if gpu.util is not None:
                    view.gpu_history.setdefault(gpu.index, deque(maxlen=HISTORY)).append(gpu.util)

    def _unresponsive(self, name: str, silent_since: float) -> None:
        """The agent's link is open but it has not answered since `silent_since`."""
        self._update(
            name,
            state="unresponsive",
            error=f"agent not responding for {time.monotonic() - silent_since:.0f} s "
            "(the connection is still open)",
        )

    def _stream_started(self, name: str, reply: Any) -> None:
        if isinstance(reply, dict) and reply.get("stream"):
            with self._lock:
                self._stream_ids[name] = max(int(reply["stream"]), self._stream_ids.get(name, 0))

    def _supervise(self, session: NodeSession) -> None:
        failures = 0  # consecutive; the wait between attempts follows the session's Backoff
        name = session.name
        closed = threading.Event()

        def on_event(_session: NodeSession, message: dict[str, Any]) -> None:
            kind = message.get("event")
            if kind == "sample":
                stream = int(message.get("stream") or 0)
                if "readings" in message:
                    self._on_readings(name, message["readings"], stream)
                else:
                    self._on_sample(name, message.get("data", {}), stream)
            elif kind == "closed":
                closed.set()

        session.on_event = on_event
        while not self._stop.is_set():
            closed.clear()
            with self._lock:
                self._stream_ids.pop(name, None)  # a new agent counts its streams from 1
                self._whole_from.pop(name, None)
            self._update(name, state="connecting")
            silent_since: float | None = None
            stream: PendingReply | None = None  # the stream request, while it is not answered
            try:
                session.connect(force=True)  # this loop does the waiting between attempts
                self._update(
                    name, state="up", error=None, latency=session.latency, hello=session.hello
                )
                client = session.client
                assert client is not None
                stream = client.request_async("stream", self._stream_args(self.include_all))
                try:
                    self._stream_started(name, stream.result(self.ping_timeout))
                    stream = None
                except TimeoutError:
                    # Frozen before it answered: unresponsive like a ping without an answer
                    # (not down after the request's whole timeout); the pings below go on
                    # and the answer is taken when it comes.
                    silent_since = time.monotonic() - self.ping_timeout
                    self._unresponsive(name, silent_since)
                failures = 0
            except (AgentDisconnected, AgentError, OSError, ValueError) as exc:
                key = session.unknown_host_key
                self._update(name, state="down", error=str(exc) or exc.__class__.__name__)
                if key is not None:
                    # Retrying cannot help: wait for the user to trust (or not) the key. The
                    # console asks in a dialog (the exception's text is CLI advice).
                    self._update(
                        name,
                        host_key=f"{key.key_type} {key.fingerprint}",
                        error=f"unknown host key {key.key_type} {key.fingerprint}: "
                        "trust it (y) or refuse it (n) in the dialog",
                    )
                    self._wake[name].wait()
                    self._wake[name].clear()
                    continue
                session.close()
                failures += 1
                self._wake[name].wait(session.backoff.delay(failures))
                self._wake[name].clear()
                continue
            # Measure latency now and then while the stream runs; wait for the link to drop.
            # A ping without an answer while the link stays open is a frozen or overloaded
            # agent: say so, keep the link, and keep asking until it answers again.
            stream_error = None
            while not self._stop.is_set() and not closed.wait(self.ping_every):
                client = session.client
                if client is None:
                    break
                if stream is not None and stream.done():
                    try:
                        self._stream_started(name, stream.result(0))
                    except (AgentDisconnected, AgentError) as exc:
                        stream_error = f"stream: {exc}"
                        break
                    stream = None
                try:
                    latency = client.round_trip(timeout=self.ping_timeout)
                except AgentNotResponding:
                    silent_since = silent_since or time.monotonic() - self.ping_timeout
                    self._unresponsive(name, silent_since)
                    continue
                except (AgentDisconnected, AgentError):
                    break
                if silent_since is not None:
                    silent_since = None
                    self._update(name, state="up", error=None)
                self._update(name, latency=latency)
            if self._stop.is_set():
                break
            reason = session.client.closed_reason if session.client else None
            session.close()
            self._update(name, state="down", error=stream_error or reason or "connection lost")
            failures += 1
            self._wake[name].wait(session.backoff.delay(failures))
            self._wake[name].clear()


class RecordedMonitor:
    """A monitor over fixed node views: recorded samples replayed for screenshots and tests."""

    def __init__(self, views: list[NodeView], trainer: TrainerStates | None = None) -> None:
        self.views = views
        self.include_all = False
        self.trainer = trainer  # a recorded trainer state

    def trainer_state(self) -> TrainerStates | None:
        return self.trainer

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def snapshot(self) -> list[NodeView]:
        return list(self.views)

    def memory(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], MemoryTrend]:
        return {}  # one recorded sample: no series

    def recent_gone(self) -> list[GoneRank]:
        return []

    def idle_gpus(self) -> list[IdleRank]:
        return []

    def set_include_all(self, include_all: bool) -> None:
        self.include_all = include_all

    def trust_host_key(self, name: str) -> None:
        for view in self.views:
            if view.name == name:
                view.host_key = None
