"""The trainer's version for the live Cluster screen, read now and then off the UI thread.

The version flags (`version_lag`, `paused_after_update` while the trainer moved on) need
the trainer's weight version, which only the job's files say. `nodes` reads it once
(`fleet_trainer_state`); the live screen reads it the same way from a thread, every
INTERVAL seconds, and only while some server the agents poll reports a weight version.
One read asks at most MAX_NODES nodes (those running the controller or the lowest rank
first; a job's log directory is usually on a shared file system, so one node is enough),
each for the tails of the job's logs, one perf tracer file and the config files: the
same bounded `file_tail`/`file_read` calls as `nodes`, as the job's user's files only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_console.core.metrics.logdir import log_dir_from_processes
from areal_console.core.rollout.context import fleet_trainer_state

if TYPE_CHECKING:
    from areal_console.core.connection.fleet import NodeSession

INTERVAL = 20.0  # seconds between reads
MAX_NODES = 2  # nodes asked per read
FIRST_READ = 3.0  # seconds after start


@dataclass(frozen=True, slots=True)
class TrainerState:
    """What the version flags use: the trainer's version (None: not found) and
    `rollout.max_head_offpolicyness`, read at `read_at` (time.time())."""

    version: int | None
    evidence: str
    max_head_offpolicyness: int | None
    read_at: float


def _cmdlines(node: dict[str, Any]) -> list[str]:
    return [str(p.get("cmdline") or "") for p in node.get("processes") or [] if isinstance(p, dict)]


def versioned_servers(nodes: Iterable[dict[str, Any]]) -> bool:
    """Does some polled server report a weight version (else no flag needs the trainer)?"""
    return any(
        isinstance(p, dict)
        and isinstance(p.get("server"), dict)
        and p["server"].get("polled")
        and type(p["server"].get("weight_version")) is int
        for n in nodes
        for p in n.get("processes") or []
    )


def nodes_to_ask(nodes: list[dict[str, Any]], user: str, limit: int = MAX_NODES) -> list[str]:
    """The up nodes whose processes name the job's log directory, the controller's or the
    lowest rank's first, at most `limit`."""

    def order(node: dict[str, Any]) -> tuple[int, int, str]:
        procs = [p for p in node.get("processes") or [] if isinstance(p, dict)]
        ranks = [p["rank"] for p in procs if type(p.get("rank")) is int]
        controller = any(p.get("role") == "controller" for p in procs)
        return (0 if controller else 1, min(ranks, default=1 << 30), str(node.get("name")))

    found = [
        n
        for n in nodes
        if n.get("state") == "up" and log_dir_from_processes(_cmdlines(n), user) is not None
    ]
    return [str(n.get("name")) for n in sorted(found, key=order)[:limit]]


def read_trainer_state(
    sessions: Iterable[NodeSession], nodes: list[dict[str, Any]], user: str
) -> TrainerState | None:
    """One read (None: no server reports a version, or no node names a log directory)."""
    if not versioned_servers(nodes):
        return None
    names = nodes_to_ask(nodes, user)
    chosen = [s for s in sessions if s.name in names]
    if not chosen:
        return None
    state = fleet_trainer_state(chosen, nodes, user)
    head = state.config.get("rollout.max_head_offpolicyness") or {}
    value = head.get("value")
    trainer = state.trainer
    return TrainerState(
        None if trainer is None else trainer.version,
        "" if trainer is None else trainer.evidence,
        value if type(value) is int else None,
        time.time(),
    )


class TrainerWatch:
    """A daemon thread that keeps `state()` fresh: `sessions()` and `nodes()` give the
    fleet's sessions and its nodes' `{"name", "state", "processes"}` at each read."""

    def __init__(
        self,
        sessions: Callable[[], Iterable[NodeSession]],
        nodes: Callable[[], list[dict[str, Any]]],
        user: str,
        interval: float = INTERVAL,
    ) -> None:
        self.sessions, self.nodes, self.user, self.interval = sessions, nodes, user, interval
        self._state: TrainerState | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reads = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainer-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def state(self) -> TrainerState | None:
        return self._state

    def read_now(self) -> TrainerState | None:
        """One read; a failed one keeps the last state (the files are read again later)."""
        nodes = self.nodes()
        if not versioned_servers(nodes):
            self._state = None
            return None
        try:
            found = read_trainer_state(self.sessions(), nodes, self.user)
        except Exception:  # a node gone mid-read: the next read tries again
            return self._state
        self.reads += 1
        if found is not None:
            self._state = found
        return self._state

    def _run(self) -> None:
        delay = min(FIRST_READ, self.interval)  # the nodes' first samples arrive meanwhile
        while not self._stop.wait(delay):
            self.read_now()
            delay = self.interval
