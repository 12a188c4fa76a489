"""Stand-in for AReaL's rollout dispatcher (areal/infra/workflow_executor.py at cbff54d6),
tests only: the same classes, methods and waits, with the staleness formula of
areal/infra/staleness_manager.py:79-113. A batch consumed at weight version 0 with
`max_head_offpolicyness=0` leaves no capacity, so nothing is submitted and the caller
waits in `wait_results` forever: the stall AReaL's debugging guide warns about."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any


class StalenessManager:
    def __init__(self, max_concurrent_rollouts: int, consumer_batch_size: int, max_staleness: int):
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.consumer_batch_size = consumer_batch_size
        self.max_staleness = max_staleness
        self.version = 0
        self.accepted = consumer_batch_size  # one batch already trained on at version 0
        self.running = 0

    def get_pending_limit(self) -> int:
        return (self.max_staleness + 1) * self.consumer_batch_size

    def get_capacity(self) -> int:
        concurrency = max(1, self.max_concurrent_rollouts) - self.running
        staleness = (self.max_staleness + self.version + 1) * self.consumer_batch_size - (
            self.accepted + self.running
        )
        return min(concurrency, staleness)


class BatchTaskDispatcher:
    def __init__(self, staleness_manager: StalenessManager) -> None:
        self.staleness_manager = staleness_manager
        self._input_cv = threading.Condition()
        self._result_cv = threading.Condition()
        self._pending_inputs: deque[Any] = deque()
        self._pending_results: dict[int, Any] = {}
        self._shutdown_event = threading.Event()

    def initialize(self) -> None:
        self._commit_thread = threading.Thread(target=self._commit_loop, daemon=True)
        self._commit_thread.start()

    def _commit_loop(self) -> None:
        while not self._shutdown_event.is_set():
            task_input = self._get_next_task_for_submission()
            if task_input is None:
                continue
            self.staleness_manager.running += 1

    def _get_next_task_for_submission(self) -> Any:
        with self._input_cv:
            while not self._shutdown_event.is_set():
                if self.staleness_manager.get_capacity() > 0 and self._pending_inputs:
                    return self._pending_inputs.popleft()
                self._input_cv.wait()
        return None

    def submit_task_input(self, task_input: Any) -> None:
        with self._input_cv:
            self._pending_inputs.append(task_input)
            self._input_cv.notify()

    def wait_results(self, count: int, timeout: float | None = None) -> list[Any]:
        start = time.perf_counter()
        timeout = 7 * 24 * 3600 if timeout is None else timeout
        with self._result_cv:
            while len(self._pending_results) < count:
                remaining = timeout - (time.perf_counter() - start)
                if remaining <= 0:
                    raise TimeoutError(f"Timed out waiting for {count} results")
                self._result_cv.wait(timeout=remaining)
            drained = list(self._pending_results.values())
            self._pending_results.clear()
        return drained

    def active_submit_and_wait(self, input_generator: Iterator[Any], batch_size: int) -> list[Any]:
        results: list[Any] = []
        while True:
            with self._input_cv:
                pending = len(self._pending_inputs)
            capacity = self.staleness_manager.get_pending_limit() - pending
            for _ in range(max(0, min(batch_size, capacity))):
                self.submit_task_input(next(input_generator))
            try:
                arrived = self.wait_results(count=batch_size - len(results), timeout=1)
            except TimeoutError:
                arrived = []
            results.extend(arrived)
            if len(results) >= batch_size:
                return results
