"""Stand-in for AReaL's single-controller RolloutController (tests only): `prepare_batch`
hands the dataloader to the dispatcher's `active_submit_and_wait`, as
areal/infra/controller/rollout_controller.py:1023-1071 does at cbff54d6."""

from __future__ import annotations

import itertools
from typing import Any

from areal.infra.workflow_executor import BatchTaskDispatcher, StalenessManager


class RolloutController:
    def __init__(
        self, max_concurrent_rollouts: int, consumer_batch_size: int, max_head_offpolicyness: int
    ):
        manager = StalenessManager(
            max_concurrent_rollouts, consumer_batch_size, max_head_offpolicyness
        )
        self.dispatcher = BatchTaskDispatcher(manager)
        self.dispatcher.initialize()

    def prepare_batch(self, dataloader: list[Any], batch_size: int) -> list[Any]:
        return self.dispatcher.active_submit_and_wait(itertools.cycle(dataloader), batch_size)
