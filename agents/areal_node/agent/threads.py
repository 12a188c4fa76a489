"""Threads for the agent's requests and parallel work.

concurrent.futures would do, but its imports alone cost a one-shot capture 5 ms.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Workers:
    """Runs submitted calls on at most `limit` threads, started as they are needed.

    `shutdown()` ends the threads once the queued calls ran (`cancel=True`: once the
    running ones did); with `wait`, it returns when they have ended (or `timeout` passed).

    A call its owner gave up on (`overdue(+1)`, a request past its deadline) no longer
    counts against `limit`: a thread starts for the next call in its place, up to
    `hard_limit` threads in all; `overdue(-1)` when it ends."""

    def __init__(self, limit: int, name: str, hard_limit: int | None = None) -> None:
        self._limit = max(1, limit)
        self._hard_limit = max(self._limit, hard_limit or self._limit)
        self._overdue = 0
        self._name = name
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a call, not yet woken for one
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self._name}: no calls after shutdown")
            self._calls.append((fn, args))
            try:
                self._wake()
            except RuntimeError:  # the interpreter is exiting: keep nothing of this call
                self._calls.pop()
                raise

    def _wake(self) -> None:
        """A thread for the next queued call: an idle one, or a new one (lock held)."""
        if self._idle:
            self._idle -= 1
            self._cond.notify()
            return
        busy = len(self._threads) - self._overdue
        if busy < self._limit and len(self._threads) < self._hard_limit:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def overdue(self, delta: int) -> None:
        """One running call more (+1) or fewer (-1) that no longer counts against the limit."""
        with self._cond:
            self._overdue = max(0, self._overdue + delta)
            if delta > 0 and self._calls and not self._closed:
                with contextlib.suppress(RuntimeError):
                    self._wake()

    def _work(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._calls and not self._closed:
                        self._idle += 1
                        self._cond.wait()
                    if not self._calls:
                        return
                    fn, args = self._calls.popleft()
                fn(*args)
        finally:
            with self._cond:
                self._threads.remove(threading.current_thread())

    def shutdown(
        self, wait: bool = True, cancel: bool = False, timeout: float | None = None
    ) -> None:
        with self._cond:
            self._closed = True
            if cancel:
                self._calls.clear()
            self._cond.notify_all()
            threads = list(self._threads)
        if wait:
            end = None if timeout is None else time.monotonic() + timeout
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join(None if end is None else max(0.0, end - time.monotonic()))


class Call:
    """One request on its way: answered exactly once, by its handler or at its deadline."""

    def __init__(self, rid: Any, name: str, seconds: float) -> None:
        self.rid, self.name, self.seconds = rid, name, seconds
        self.due = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._state = "queued"  # running, answered
        self.overdue = False  # its deadline passed while its handler ran

    def start(self) -> bool:
        """The handler starts: False when the deadline already answered it."""
        with self._lock:
            if self._state != "queued":
                return False
            self._state = "running"
            return True

    def finish(self) -> bool:
        """The handler answers: False when the deadline already did."""
        with self._lock:
            if self._state == "answered":
                return False
            self._state = "answered"
            return True

    def expire(self) -> bool:
        """The deadline answers: False when the handler already did."""
        with self._lock:
            if self._state == "answered":
                return False
            self.overdue = self._state == "running"
            self._state = "answered"
            return True


class Deadlines:
    """One thread that calls `expire(call)` at each call's deadline (a heap of them)."""

    def __init__(self, expire: Callable[[Call], None]) -> None:
        self._expire = expire
        self._heap: list[tuple[float, int, Call]] = []
        self._count = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, call: Call) -> None:
        with self._cond:
            if self._stopped:
                return
            self._count += 1
            heapq.heappush(self._heap, (call.due, self._count, call))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, _, call = heapq.heappop(self._heap)
            try:
                self._expire(call)
            except Exception:  # the answer could not be written: nothing more to do
                pass


def parallel_map(fn: Callable[[T], R], items: Iterable[T], limit: int) -> list[R]:
    """`[fn(x) for x in items]`, on up to `limit` threads; in order. The first exception
    any call raised is raised here (after the others ran); one item runs inline."""
    todo = list(items)
    if len(todo) <= 1 or limit <= 1:
        return [fn(x) for x in todo]
    results: list[Any] = [None] * len(todo)
    errors: list[BaseException] = []
    next_index = iter(range(len(todo)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            try:
                results[i] = fn(todo[i])
            except BaseException as exc:  # handed to the caller
                with lock:
                    errors.append(exc)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(limit, len(todo)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
