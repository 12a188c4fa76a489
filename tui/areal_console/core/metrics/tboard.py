"""Scalars from tensorboard event files, read with the `tensorboard` package's own loader.

AReaL's StatsLogger writes every stat with tensorboardX `add_scalar(key, value, step)`,
step = global_step from 0 (areal/utils/stats_logger.py:156-158 at cbff54d6), when
`stats_logger.tensorboard.path` is set. The loader keeps its file position, so each poll
reads only the events appended since the last one.
"""

from __future__ import annotations

import math
import os
from typing import Any

from areal_node.agent.logs import find_logs
from areal_node.agent.protocol import OpError

from areal_console.core.metrics.store import MetricStore


def find_event_files(path: str) -> list[str]:
    """Event files at `path`: the file itself, or those under the directory (the agent's
    `log_find` rule: three levels down)."""
    if os.path.isfile(path):
        return [path]
    try:
        return list(find_logs(path)["events"])
    except OpError:
        return []


def scalar_of(value: Any) -> float | None:
    """The float in one summary value: `simple_value`, or a scalar tensor (tensorboardX >= 2.6)."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor"):
        tensor = value.tensor
        for field in (tensor.float_val, tensor.double_val, tensor.int_val, tensor.int64_val):
            if len(field):
                return float(field[0])
    return None


class TensorboardReader:
    """Follows the event files of one tensorboard directory into a `MetricStore`."""

    def __init__(self, path: str, store: MetricStore | None = None) -> None:
        self.path = path
        self.store = store if store is not None else MetricStore()
        self._loaders: dict[str, Any] = {}
        self._step_wall: dict[int, float] = {}
        self.last_wall: float | None = None

    def poll(self) -> int:
        """Read what was appended since the last poll; returns how many scalars were added."""
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        added = 0
        for name in find_event_files(self.path):
            loader = self._loaders.get(name)
            if loader is None:
                loader = self._loaders[name] = EventFileLoader(name)
            for event in loader.Load():
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    number = scalar_of(value)
                    if number is None:
                        continue
                    self.store.add_scalar(value.tag, int(event.step), number)
                    added += 1
                    if event.step not in self._step_wall:
                        self._step_wall[event.step] = event.wall_time
                        self.store.mark_step(int(event.step), float(event.wall_time))
                    self.last_wall = float(event.wall_time)
        return added

    def step_time(self, step: int) -> float:
        return self._step_wall.get(step, math.nan)
