"""The one way tests wait: for a condition, never for a fixed time.

`wait_for` blocks a thread (CLI runs, agents, clusters); `until` lets a Textual app run
(Pilot tests; workers post from threads, so the UI needs its event loop meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 60.0,
    what: str = "condition",
    interval: float = 0.05,
) -> T:
    """The first truthy value of `predicate()`; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


async def until(
    pilot: Any, condition: Callable[[], object], timeout: float = 30.0, what: str = "condition"
) -> None:
    """Let the app run (`pilot`, or plain asyncio when None) until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        if pilot is None:
            await asyncio.sleep(0.05)
        else:
            await pilot.pause(0.05)
