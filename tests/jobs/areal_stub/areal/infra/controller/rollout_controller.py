"""Stand-in for AReaL's single-controller RolloutController (tests only): `prepare_batch`
hands the dataloader to the dispatcher's `active_submit_and_wait`, as
areal/infra/controller/rollout_controller.py:1023-1071 does at cbff54d6.

With `log_dir` (rollout.enable_rollout_tracing on), the first batch's accepted rollouts
are logged as the controller logs them (rollout_controller.py:842-849, :910-918) into
`main.log`, the controller's file log (areal/utils/logging.py:415-460, its LOG_FORMAT :18
and DATE_FORMAT :22; rl_trainer.py:133)."""

from __future__ import annotations

import itertools
from typing import Any

from areal.infra.workflow_executor import BatchTaskDispatcher, StalenessManager

AREAL_HEADER = "\033[1;38;2;180;140;80m(AReaL)\033[0m"
LOG_FORMAT = (
    f"{AREAL_HEADER} \033[37m%(asctime)s.%(msecs)03d %(name)s %(levelname)s: %(message)s\033[0m"
)


class RolloutController:
    def __init__(
        self,
        max_concurrent_rollouts: int,
        consumer_batch_size: int,
        max_head_offpolicyness: int,
        log_dir: str | None = None,
    ):
        manager = StalenessManager(
            max_concurrent_rollouts, consumer_batch_size, max_head_offpolicyness
        )
        if log_dir is not None:
            import logging
            import os

            os.makedirs(log_dir, exist_ok=True)
            logger = logging.getLogger("RolloutController")
            handler = logging.FileHandler(os.path.join(log_dir, "main.log"))
            handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%Y%m%d-%H:%M:%S"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            for accepted in range(1, consumer_batch_size + 1):
                running = consumer_batch_size - accepted
                logger.info(
                    f"Finish and accept rollout. enqueued: 0, running: {running}, "
                    f"accepted: {accepted}, rejected: 0."
                )
            handler.flush()
        self.dispatcher = BatchTaskDispatcher(manager)
        self.dispatcher.initialize()

    def prepare_batch(self, dataloader: list[Any], batch_size: int) -> list[Any]:
        return self.dispatcher.active_submit_and_wait(itertools.cycle(dataloader), batch_size)
