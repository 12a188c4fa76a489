"""`areal-console watch` as a test runs it: a subprocess whose stdout (events, one JSON
object a line) and stderr (notes) lines are collected as they come."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TypeVar

from tests.support.signals import sigint_default
from tests.support.waits import wait_for

T = TypeVar("T")


class Watch:
    """A running `areal-console watch --json`."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "areal_console", "watch", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=sigint_default,
        )  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in list(self.out)]

    def event(self, kind: str, timeout: float = 120) -> dict[str, object]:
        """The first event of `kind`, once it came."""
        return self._wait(lambda: next((e for e in self.events() if e["event"] == kind), None),
                          timeout, f"a {kind} event")  # fmt: skip

    def said(self, text: str, timeout: float = 60) -> str:
        """The first note on stderr that contains `text`, once it came."""
        return self._wait(lambda: next((line for line in list(self.err) if text in line), None),
                          timeout, repr(text))  # fmt: skip

    def _wait(self, predicate: Callable[[], T | None], timeout: float, what: str) -> T:
        try:
            return wait_for(predicate, timeout=timeout, what=what)
        except TimeoutError as exc:  # say what the watch said meanwhile
            raise TimeoutError(f"{exc}; exit {self.proc.poll()}; stdout: {self.out}; "
                               f"stderr: {self.err}") from None  # fmt: skip

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        for reader in self.readers:
            reader.join(timeout=10)
        return code


@contextmanager
def watching(*args: str, env: dict[str, str]) -> Iterator[Watch]:
    """A watch for the block's length; killed after it if still running."""
    watch = Watch(*args, env=env)
    try:
        yield watch
    finally:
        if watch.proc.poll() is None:
            watch.proc.kill()
            watch.proc.wait()
