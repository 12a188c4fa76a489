"""The trainers' versions for the live Cluster screen, read now and then off the UI thread.

The version flags (`version_lag`, `paused_after_update` while the trainer moved on) need
the trainer's weight version of the server's run, which only that run's files say.
`nodes` reads them once (`fleet_trainer_state`); the live screen reads them the same way
from a thread, every INTERVAL seconds, and only while some server the agents poll
reports a weight version. One read asks for the runs of such servers only, at most
MAX_RUNS of them (the others are named as skipped), and per run at most MAX_NODES nodes
(the controller's or the lowest rank's first; a log directory is usually on a shared
file system, so one node is enough), each for the tails of the run's logs, one perf
tracer file and the config files: the same bounded `file_tail`/`file_read` calls as
`nodes`, as the run's user's files only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_console.core.rollout.context import (
    MAX_RUN_NODES,
    MAX_RUNS,
    fleet_trainer_state,
    run_trainer,
    versioned_servers,
)
from areal_console.core.rollout.jobs import Run

if TYPE_CHECKING:
    from areal_console.core.connection.fleet import NodeSession

INTERVAL = 20.0  # seconds between reads
MAX_NODES = MAX_RUN_NODES  # nodes asked per run
FIRST_READ = 3.0  # seconds after start


@dataclass(frozen=True, slots=True)
class TrainerState:
    """What the version flags of one run's servers use: the trainer's version (None: not
    found) and `rollout.max_head_offpolicyness`, read at `read_at` (time.time())."""

    version: int | None
    evidence: str
    max_head_offpolicyness: int | None
    read_at: float
    run: Run | None = None  # whose trainer (None: no run: held to no server)


@dataclass(frozen=True, slots=True)
class TrainerStates:
    """One read: each run's trainer state, the runs not read (labels) and notes."""

    states: tuple[TrainerState, ...]
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def runs(self) -> list[Run]:
        return [s.run for s in self.states if s.run is not None]

    def trainers(self) -> dict[str, tuple[int | None, int | None]]:
        """log_dir -> (version, max_head_offpolicyness), for `servers.run_flags`."""
        return {
            s.run.log_dir: (s.version, s.max_head_offpolicyness)
            for s in self.states
            if s.run is not None
        }


def read_trainer_state(
    sessions: Iterable[NodeSession], nodes: list[dict[str, Any]], user: str
) -> TrainerStates:
    """One read, for the runs whose polled servers report a version."""
    found = fleet_trainer_state(sessions, nodes, user, MAX_RUNS, MAX_NODES)
    now = time.time()
    states = []
    for log_dir, summary in found.read.items():
        version, max_head = run_trainer(summary)
        evidence = "" if summary.trainer is None else summary.trainer.evidence
        states.append(
            TrainerState(
                version,
                evidence,
                max_head,
                now,
                found.runs.runs[log_dir],
            )
        )
    return TrainerStates(tuple(states), tuple(found.skipped), tuple(found.notes))


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
        self._state: TrainerStates | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reads = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainer-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def state(self) -> TrainerStates | None:
        return self._state

    def read_now(self) -> TrainerStates | None:
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
        self._state = found
        return self._state

    def _run(self) -> None:
        delay = min(FIRST_READ, self.interval)  # the nodes' first samples arrive meanwhile
        while not self._stop.wait(delay):
            self.read_now()
            delay = self.interval
