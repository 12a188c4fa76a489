"""Threads for the agent's requests and parallel work.

concurrent.futures would do, but its imports alone cost a one-shot capture 5 ms.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Workers:
    """Runs submitted calls on at most `limit` threads, started as they are needed.

    `shutdown()` ends the threads once the queued calls ran (`cancel=True`: once the
    running ones did); with `wait`, it returns when they have ended."""

    def __init__(self, limit: int, name: str) -> None:
        self._limit = max(1, limit)
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
            if self._idle:
                self._idle -= 1
                self._cond.notify()
            elif len(self._threads) < self._limit:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError:  # the interpreter is exiting: keep nothing of this call
                    self._calls.pop()
                    raise
                self._threads.append(thread)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._calls and not self._closed:
                    self._idle += 1
                    self._cond.wait()
                if not self._calls:
                    return
                fn, args = self._calls.popleft()
            fn(*args)

    def shutdown(self, wait: bool = True, cancel: bool = False) -> None:
        with self._cond:
            self._closed = True
            if cancel:
                self._calls.clear()
            self._cond.notify_all()
        if wait:
            for thread in list(self._threads):
                if thread is not threading.current_thread():
                    thread.join()


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
