"""Pacing SSH handshakes under sshd's MaxStartups.

An sshd drops new connections once too many are unauthenticated (`MaxStartups`,
10:30:100 by default: from 10 on, 30% are dropped, rising to all at 100). A login or jump
host in front of 512 nodes would start dropping the console's connections, so every
handshake takes a slot of its gateway first: the first jump host of its route, or the
sshd itself when there is none. At most `limit` handshakes are in flight per gateway;
the others wait, and the listeners hear once per gateway that they do.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

Listener = Callable[[str], None]


@dataclass
class _Gate:
    cond: threading.Condition = field(default_factory=threading.Condition)
    in_flight: int = 0
    peak: int = 0  # most handshakes in flight at once, for status lines and tests
    said: bool = False  # the listeners heard about waiting here (once per gateway)


class StartupPacer:
    """Bounded SSH handshakes in flight per gateway (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[str, _Gate] = {}
        self._listeners: list[Listener] = []

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(line)` when handshakes start waiting at a gateway; returns the
        function that stops it."""
        with self._lock:
            self._listeners.append(listener)

        def stop() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return stop

    def _gate(self, gateway: str) -> _Gate:
        with self._lock:
            return self._gates.setdefault(gateway, _Gate())

    @contextlib.contextmanager
    def slot(self, gateway: str, limit: int) -> Iterator[None]:
        """Hold one of `gateway`'s `limit` handshake slots for the `with` body."""
        gate = self._gate(gateway)
        limit = max(1, limit)
        with gate.cond:
            tell = gate.in_flight >= limit and not gate.said
            gate.said = gate.said or tell
        if tell:
            self._tell(
                f"pacing SSH handshakes through {gateway}: {limit} in flight, the other nodes "
                "wait their turn (under sshd's MaxStartups; --max-startups changes it)"
            )
        with gate.cond:
            while gate.in_flight >= limit:
                gate.cond.wait()
            gate.in_flight += 1
            gate.peak = max(gate.peak, gate.in_flight)
        try:
            yield
        finally:
            with gate.cond:
                gate.in_flight -= 1
                gate.cond.notify()

    def _tell(self, line: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            with contextlib.suppress(Exception):  # a broken listener must not stop a connect
                listener(line)

    def peak(self, gateway: str) -> int:
        """The most handshakes that were in flight at once through `gateway`."""
        return self._gate(gateway).peak

    def reset(self, gateway: str) -> None:
        """Forget `gateway`'s peak and whether waiting was said (a new run)."""
        gate = self._gate(gateway)
        with gate.cond:
            gate.peak, gate.said = gate.in_flight, False


PACER = StartupPacer()
