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
from areal_console.core.metrics.tfrecord import RecordFile, RecordFileError


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
    """Follows the event files of one tensorboard directory into a `MetricStore`.

    A file that cannot be read on (see `tfrecord`) is dropped with a line in `errors`;
    skipped records are listed in `notes`."""

    def __init__(self, path: str, store: MetricStore | None = None) -> None:
        self.path = path
        self.store = store if store is not None else MetricStore()
        self._files: dict[str, RecordFile] = {}
        self._step_wall: dict[int, float] = {}
        self.last_wall: float | None = None
        self.errors: dict[str, str] = {}  # file -> why it is no longer read

    @property
    def unread_bytes(self) -> int:
        """Bytes the last poll left for the next (it reads a bounded amount)."""
        return sum(f.unread for f in self._files.values())

    @property
    def files(self) -> list[str]:
        """The event files seen so far."""
        return list(self._files)

    @property
    def notes(self) -> list[str]:
        """Everything that went wrong, one line each (errors first)."""
        skipped = [line for f in self._files.values() for line in f.skipped]
        return [*self.errors.values(), *skipped]

    def poll(self) -> int:
        """Read what was appended since the last poll; returns how many scalars were added."""
        added = 0
        for name in find_event_files(self.path):
            if name in self.errors:
                continue
            reader = self._files.get(name)
            if reader is None:
                reader = self._files[name] = RecordFile(name)
            try:
                for record in reader.records():
                    added += self._add(reader, record)
            except RecordFileError as exc:
                self.errors[name] = str(exc)
            except OSError as exc:
                self.errors[name] = f"{name}: cannot read: {exc.strerror or exc}"
        return added

    def _add(self, reader: RecordFile, record: bytes) -> int:
        from google.protobuf.message import DecodeError
        from tensorboard.compat.proto.event_pb2 import Event

        try:
            event = Event.FromString(record)
        except (DecodeError, RecursionError, ValueError):
            reader.skipped.append(f"{reader.path}: a record that is not an event: skipped")
            return 0
        if not event.HasField("summary"):
            return 0
        added = 0
        step = int(event.step)
        for value in event.summary.value:
            number = scalar_of(value)
            if number is None:
                continue
            self.store.add_scalar(value.tag, step, number)
            added += 1
            if step not in self._step_wall:
                self._step_wall[step] = event.wall_time
                self.store.mark_step(step, float(event.wall_time))
            self.last_wall = float(event.wall_time)
        return added

    def step_time(self, step: int) -> float:
        return self._step_wall.get(step, math.nan)
